"""`mule demo` at several dataset sizes: wall time per stage, peak memory, val and test mR.

    python bench/scale.py                                  # every size below, one after another
    python bench/scale.py --only multi30k-29k              # one row
    python bench/scale.py --keep-root /data/scale          # keep the workdirs (default: removed)

Each row is the real command a user types, in a new process on an empty workdir, with
the default config (nothing tuned per size). Peak memory is the largest resident set of
the command's process tree (mule and its Prefect server), sampled every 0.2 s. Per-stage
seconds come from the MLflow runs the command wrote; the divergence guard's tags say
whether any training epoch diverged. Prints a Markdown table and writes scale.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil

from mule.pipeline.declaration import REBUILD

# name -> mule demo arguments. Multi30K-style rows use Multi30K's val and test sizes beyond
# the 3k demo (which is `mule demo` as it is); COCO-style rows keep the demo's val and test.
SIZES = {
    "multi30k-3k": [],
    "multi30k-10k": ["--train-images", "10000", "--val-images", "1014", "--test-images", "1000"],
    "multi30k-29k": ["--train-images", "29000", "--val-images", "1014", "--test-images", "1000"],
    "coco-4.5k": ["--dataset", "coco"],
    "coco-18k": ["--dataset", "coco", "--train-images", "18000"],
}
STAGES = REBUILD


class PeakMemory:
    """Largest summed RSS of a process and its descendants, sampled in a thread."""

    def __init__(self, pid: int, interval: float = 0.2):
        self.root, self.interval, self.peak = psutil.Process(pid), interval, 0
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()

    def _watch(self) -> None:
        while not self._done.is_set():
            try:
                processes = [self.root, *self.root.children(recursive=True)]
                total = 0
                for process in processes:
                    try:
                        total += process.memory_info().rss
                    except psutil.Error:
                        pass
                self.peak = max(self.peak, total)
            except psutil.Error:
                pass
            self._done.wait(self.interval)

    def stop(self) -> int:
        self._done.set()
        self._thread.join()
        return self.peak


def run(name: str, args: list[str], workdir: Path) -> dict:
    mule = shutil.which("mule") or sys.exit("`mule` is not on PATH: install the package first")
    env = dict(os.environ, PREFECT_HOME=str(workdir / "prefect"))
    env.pop("PREFECT_API_URL", None)
    log = workdir.parent / f"{name}.log"
    started = time.perf_counter()
    with open(log, "w") as out:
        process = subprocess.Popen([mule, "demo", "--workdir", str(workdir), *args], env=env, stdout=out,
                                   stderr=subprocess.STDOUT, text=True)  # fmt: skip
        memory = PeakMemory(process.pid)
        code = process.wait()
    wall, peak = time.perf_counter() - started, memory.stop()
    stdout = log.read_text()
    if code != 0:
        sys.exit(f"{name}: mule demo failed (exit {code}); its output: {log}")
    test = re.search(r"mean mR over languages: ([\d.]+)\s+\(best epoch (\d+)\)", stdout)

    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{workdir / 'mlflow.db'}")
    dataset = "embedded-coco" if "coco" in args else "embedded"
    experiment = client.get_experiment_by_name(f"mule/{dataset}")
    runs = {r.info.run_name: r for r in client.search_runs([experiment.experiment_id])}
    seconds = {s: round((runs[s].info.end_time - runs[s].info.start_time) / 1000, 1) for s in STAGES if s in runs}
    train = runs["train"].data
    per_language = dict(re.findall(r"^\| (\w\w) \|[^\n]*?\| ([\d.]+) \|$", stdout, re.M))
    images = client.get_run(runs["ingest"].info.run_id).data.params.get("data.train_images")
    return {
        "name": name, "command": "mule demo " + " ".join(args), "train_images": images,
        "wall_s": round(wall, 1), "peak_memory_gb": round(peak / 2**30, 2), "stage_s": seconds,
        "val_mean_mR": round(train.metrics.get("val.best_mean_mR", float("nan")), 2),
        "test_mean_mR": float(test.group(1)) if test else None, "best_epoch": int(test.group(2)) if test else None,
        "test_mR": {k: float(v) for k, v in per_language.items()},
        "diverged": train.tags.get("mule.diverged_epoch", "no"),
    }  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", action="append", choices=sorted(SIZES), help="run this row only (repeatable)")
    parser.add_argument("--keep-root", help="keep each row's workdir under this folder")
    parser.add_argument("--out", default="scale.json")
    args = parser.parse_args()
    import torch

    print(f"machine: {platform.node()}, {os.cpu_count()} CPUs, {platform.processor() or platform.machine()}, "
          f"{psutil.virtual_memory().total / 2**30:.0f} GiB, torch {torch.__version__}, python {platform.python_version()}",
          flush=True)  # fmt: skip
    root = Path(args.keep_root) if args.keep_root else Path(tempfile.mkdtemp(prefix="mule-scale-"))
    rows = []
    for name in args.only or SIZES:
        workdir = root / name
        if workdir.exists() and any(workdir.iterdir()):
            sys.exit(f"{workdir} is not empty: every row starts from an empty workdir")
        workdir.mkdir(parents=True, exist_ok=True)
        row = run(name, SIZES[name], workdir)
        rows.append(row)
        print(json.dumps(row), flush=True)
        if not args.keep_root:
            shutil.rmtree(workdir, ignore_errors=True)
    Path(args.out).write_text(json.dumps(rows, indent=2))
    header = (
        "| run | train images | "
        + " | ".join(STAGES)
        + " | total | peak memory | val mR | test mR | best epoch | diverged |"
    )
    print("\n" + header + "\n|" + "---|" * (header.count("|") - 1))
    for r in rows:
        stages = " | ".join(f"{r['stage_s'].get(s, 0):.0f}" for s in STAGES)
        print(f"| {r['name']} | {r['train_images']} | {stages} | {r['wall_s']:.0f} s | {r['peak_memory_gb']:.1f} GB "
              f"| {r['val_mean_mR']:.1f} | {r['test_mean_mR']} | {r['best_epoch']} | {r['diverged']} |")  # fmt: skip
    for r in rows:
        print(f"{r['name']}: test mR per language {r['test_mR']}")


if __name__ == "__main__":
    main()
