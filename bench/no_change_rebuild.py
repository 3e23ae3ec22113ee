"""A rebuild with nothing changed: how long from the command to the prompt.

    python bench/no_change_rebuild.py [--runs 5] [--workdir DIR] [extra mule demo args...]

Builds a small demo workdir once (or uses --workdir, already built with the same args),
then runs the same `mule demo` command --runs times, each a fresh process timed from the
outside (Prefect's start-up included), and checks that every stage was reused. Also
times what no rebuild can avoid on this machine: importing Prefect and MLflow in a
fresh interpreter.
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

from demo_process import run_demo
from rebuild_reuse import decisions

SMALL = ["--train-images", "200", "--val-images", "50", "--test-images", "50", "--set", "train.epochs=2",
         "--set", "pretrain.epochs=1"]  # fmt: skip


def import_floor() -> float:
    started = time.perf_counter()
    subprocess.run([sys.executable, "-c", "import prefect, mlflow"], check=True)
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--workdir", help="a workdir built with the same arguments (default: a new temporary one)")
    args, extra = parser.parse_known_args()
    extra = extra or SMALL
    workdir = Path(args.workdir) if args.workdir else Path(os.environ.get("TMPDIR", "/tmp")) / "mule-bench-no-change"
    if not args.workdir:
        shutil.rmtree(workdir, ignore_errors=True)
        seconds, _ = run_demo(workdir, extra)
        print(f"first build: {seconds:.1f} s")
    walls = []
    for run in range(1, args.runs + 1):
        seconds, stdout = run_demo(workdir, extra)
        stages, _ = decisions(stdout)
        ran = [s for s, d in stages.items() if not d.startswith("reused")]
        if ran:
            sys.exit(f"run {run}: stages ran with nothing changed: {ran}")
        walls.append(seconds)
        print(f"run {run}: {seconds:.1f} s, {len(stages)} stages reused", flush=True)
    floors = [import_floor() for _ in range(3)]
    print(f"\nno-change rebuild, command to prompt: median {statistics.median(walls):.1f} s, "
          f"min {min(walls):.1f} s, max {max(walls):.1f} s over {len(walls)} runs")  # fmt: skip
    print(f"`python -c 'import prefect, mlflow'` alone: median {statistics.median(floors):.1f} s")
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}")


if __name__ == "__main__":
    main()
