"""Training and evaluation beside another busy process: OpenMP's idle threads as libgomp
leaves them (spinning a while before they sleep), spinning a short while
(GOMP_SPINCOUNT=10000), or sleeping at once (OMP_WAIT_POLICY=PASSIVE), alone and beside a
process that keeps one core busy.

    python bench/contention.py [--steps 40]

Each cell runs `bench/train_throughput.py --presets demo` in a fresh process (libgomp
reads the policy when torch loads) with torch's default threads (one per core); the busy
neighbour is a one-thread matrix-multiply loop, as a second mule run or `mule serve`
answering would be. Run it on an otherwise idle machine.
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
BUSY = ("import torch\ntorch.set_num_threads(1)\na = torch.randn(768, 768)\n"
        "while True:\n    a = torch.tanh(a @ a)\n")  # fmt: skip


POLICIES = {"libgomp's default": {}, "GOMP_SPINCOUNT=10000": {"GOMP_SPINCOUNT": "10000"},
            "OMP_WAIT_POLICY=PASSIVE": {"OMP_WAIT_POLICY": "PASSIVE"}}  # fmt: skip


def measure(policy: dict[str, str], steps: int) -> tuple[float, float]:
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    env.update(policy)
    done = subprocess.run([sys.executable, str(HERE / "train_throughput.py"), "--presets", "demo", "--steps",
                           str(steps)], capture_output=True, text=True, env=env, check=True)  # fmt: skip
    train = float(re.search(r"([\d.]+) sentences/s", done.stdout).group(1))
    evaluation = float(re.search(r"both ways\):\s+([\d.]+) s", done.stdout).group(1))
    return train, evaluation


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=40)
    args = parser.parse_args()
    print(f"machine: {platform.node()}, {os.cpu_count()} CPUs ({platform.processor() or platform.machine()})")
    print("| neighbour | idle threads | train sentences/s | evaluation s (1000 x 5000) |")
    print("|---|---|---|---|")
    for beside in (False, True):
        busy = subprocess.Popen([sys.executable, "-c", BUSY]) if beside else None
        try:
            for policy, variables in POLICIES.items():
                train, evaluation = measure(variables, args.steps)
                print(f"| {'one busy process' if beside else 'none'} | {policy} | {train:.0f} | {evaluation:.2f} |",
                      flush=True)  # fmt: skip
        finally:
            if busy:
                busy.kill()
                busy.wait()


if __name__ == "__main__":
    main()
