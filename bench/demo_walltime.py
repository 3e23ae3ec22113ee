"""Wall time of `mule demo` from an empty workdir, per stage.

    python bench/demo_walltime.py [--keep DIR] [extra mule demo args...]
    python bench/demo_walltime.py --dataset coco      # the COCO-style en/ja/zh demo

Runs the real command in a subprocess (a fresh Prefect and MLflow), then reads each
stage's start and end from the MLflow runs it wrote.
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil

from demo_process import empty_workdir, run_demo


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--keep", help="workdir to keep (default: a temporary one, removed)")
    args, extra = parser.parse_known_args()
    workdir = empty_workdir(args.keep)
    wall, stdout = run_demo(workdir, extra)

    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{workdir / 'mlflow.db'}")
    dataset = "embedded-coco" if "coco" in extra else "embedded"  # mule demo --dataset coco
    experiment = client.get_experiment_by_name(f"mule/{dataset}")
    runs = sorted(client.search_runs([experiment.experiment_id]), key=lambda r: r.info.start_time)
    import torch

    print(f"machine: {platform.node()}, {os.cpu_count()} CPUs, {platform.processor() or platform.machine()}, "
          f"torch {torch.__version__}, python {platform.python_version()}")  # fmt: skip
    print(f"command: mule demo --workdir <empty dir> {' '.join(extra)}")
    print(f"{'stage':<10} {'seconds':>8}")
    for run in runs:
        if run.info.run_name != "rebuild":
            print(f"{run.info.run_name:<10} {(run.info.end_time - run.info.start_time) / 1000:>8.1f}")
    print(f"{'total':<10} {wall:>8.1f}   (process wall time, Prefect and MLflow start-up included)")
    table = [line for line in stdout.splitlines() if line.startswith("|") or "mean mR" in line]
    print("\n".join(table))
    if not args.keep:
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
