"""What storing a model's word and n-gram tables in float16 (`output.half_tables`, the
default) costs: the model file's bytes and the test table, each seed trained once and its
file written both ways, through the commands a user types.

    python bench/half_tables.py [--workdir DIR] [--seeds 0,1,2] [--preset demo] [-- RUN_ARGS...]

For each seed, in DIR/seed-N: `mule run all --preset P --set train.seed=N --set
output.half_tables=false` (the tables in float32), then the same command with the
default: the train stage runs again (its key holds the option) to the same weights and
stores them rounded, and evaluate measures the file. RUN_ARGS go to both (`--dataset
multi30k --source ... --images ...` for the real photos). A workdir kept from an earlier
sitting is reused: what ran is not run again. Prints, per seed and their mean: the
model file's MiB and the test mean mR both ways, and the paired difference.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import sys
from pathlib import Path


def run(workdir: Path, preset: str, seed: int, half: bool, extra: list[str]) -> dict:
    cmd = [sys.executable, "-m", "mule.commands.main", "run", "all", "--workdir", str(workdir), "--preset", preset,
           "--set", f"train.seed={seed}", "--set", f"output.half_tables={str(half).lower()}", *extra]  # fmt: skip
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    results = next((workdir / "results").glob("*/evaluation.json"))
    evaluation = json.loads(results.read_text())
    model = Path(evaluation["model"])
    return {"mib": model.stat().st_size / 2**20, "mR": evaluation["mean_mR"]}


def cpu() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", default="half-tables", help="one workdir per seed below it (kept, resumable)")
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--preset", default="demo")
    parser.add_argument("extra", nargs="*", help="after --: more arguments for mule run all")
    args = parser.parse_args()
    rows = []
    for seed in (int(s) for s in args.seeds.split(",")):
        workdir = Path(args.workdir) / f"seed-{seed}"
        full = run(workdir, args.preset, seed, False, args.extra)
        half = run(workdir, args.preset, seed, True, args.extra)
        rows.append((seed, full, half))
        print(f"seed {seed}: float32 {full['mib']:.2f} MiB, test mR {full['mR']:.3f}; "
              f"float16 tables {half['mib']:.2f} MiB, test mR {half['mR']:.3f}", flush=True)  # fmt: skip
    print(f"\n{cpu()}, {len(rows)} seed(s), preset {args.preset}\n")
    print("| seed | model MiB, float32 | model MiB, float16 tables | test mR, float32 | test mR, float16 tables | difference |")
    print("|---|---|---|---|---|---|")
    for seed, full, half in rows:
        print(f"| {seed} | {full['mib']:.2f} | {half['mib']:.2f} | {full['mR']:.2f} | {half['mR']:.2f} | "
              f"{half['mR'] - full['mR']:+.3f} |")  # fmt: skip
    differences = [half["mR"] - full["mR"] for _, full, half in rows]
    spread = statistics.stdev(full["mR"] for _, full, _ in rows) if len(rows) > 1 else float("nan")
    print(f"\nmean difference {statistics.mean(differences):+.3f} mR (largest {max(differences, key=abs):+.3f}); "
          f"the float32 seeds' spread {spread:.2f}; bytes {statistics.mean(h['mib'] / f['mib'] for _, f, h in rows):.3f} "
          f"of float32's")  # fmt: skip


if __name__ == "__main__":
    main()
