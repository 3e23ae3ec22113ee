"""What `mule ui` costs to start: its processes, their CPU-seconds and memory once the
UI answers and has settled, with MLflow's job runner (MLflow 3's default) and without it
(what `mule ui` sets unless MLFLOW_SERVER_ENABLE_JOB_EXECUTION is in the environment).

    python bench/ui_startup.py [--settle 20]

Run it on an otherwise idle machine.
"""

from __future__ import annotations

import argparse
import os
import platform
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

import psutil


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def measure(job_execution: str, settle: float) -> tuple[int, float, float, float]:
    """(processes, CPU-seconds, RSS MiB, seconds until the UI answered) of one `mule ui`."""
    workdir = tempfile.mkdtemp(prefix="mule-ui-bench-")
    from mlflow.tracking import MlflowClient

    MlflowClient(f"sqlite:///{workdir}/mlflow.db").create_experiment("mule/bench")  # a store to show
    port = free_port()
    env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": job_execution}
    started = time.monotonic()
    ui = subprocess.Popen([sys.executable, "-m", "mule.commands", "ui", "--workdir", workdir, "--port", str(port)],
                          env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)  # fmt: skip
    try:
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2)
                break
            except OSError:
                if ui.poll() is not None:
                    raise SystemExit(f"mule ui exited with {ui.returncode}") from None
                time.sleep(0.2)
        answered = time.monotonic() - started
        time.sleep(settle)
        tree = [psutil.Process(ui.pid), *psutil.Process(ui.pid).children(recursive=True)]
        cpu = sum(p.cpu_times().user + p.cpu_times().system for p in tree)
        rss = sum(p.memory_info().rss for p in tree) / 2**20
        return len(tree), cpu, rss, answered
    finally:
        os.killpg(ui.pid, signal.SIGINT)
        ui.wait(timeout=30)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--settle", type=float, default=20.0, help="seconds after the UI answers")
    args = parser.parse_args()
    print(f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}; "
          f"measured {args.settle:.0f} s after the UI answered")  # fmt: skip
    print("| MLflow's job runner | processes | CPU-seconds | RSS MiB | UI answered after s |")
    print("|---|---|---|---|---|")
    for label, value in (("on (MLflow's default)", "true"), ("off (mule ui's default)", "false")):
        processes, cpu, rss, answered = measure(value, args.settle)
        print(f"| {label} | {processes} | {cpu:.1f} | {rss:.0f} | {answered:.1f} |")


if __name__ == "__main__":
    main()
