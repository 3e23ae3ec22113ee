"""What a rebuild costs when little or nothing changed (content-addressed stages).

    python bench/rebuild_reuse.py [--keep DIR] [extra mule demo args...]

Four runs of the real `mule demo` command on one workdir, each a fresh process (Prefect
start-up included), timed from the outside:
  1. the full rebuild from an empty workdir;
  2. the same command again, nothing changed (target: <= 10 s, every stage reused);
  3. after editing one German training caption in the raw files (target: only the
     text-side stages run: ingest, translate, text, pretrain, train, evaluate; not features);
  4. after replacing one image file under the same name (ingest and features run, and
     features extract that one image; the text side is reused up to training).
"""

from __future__ import annotations

import argparse
import gzip
import os
import platform
import shutil
import sys
from pathlib import Path

from demo_process import empty_workdir, run_demo


def decisions(stdout: str) -> tuple[dict[str, str], str]:
    """The "Stages:" block `mule` prints (stage -> ran (why) / reused (key)), and the mean mR line."""
    stages, inside = {}, False
    for line in stdout.splitlines():
        if line.strip() == "Stages:":
            inside = True
        elif inside and line.startswith("  ") and line.split():
            stage, decision = line.strip().split(None, 1)
            stages[stage] = decision
        elif inside:
            inside = False
    mean = next((line for line in stdout.splitlines() if line.startswith("mean mR")), "")
    return stages, mean


def edit_one_caption(workdir: Path) -> str:
    path = workdir / "raw" / "embedded" / "data" / "task2" / "raw" / "train.1.de.gz"
    lines = gzip.decompress(path.read_bytes()).decode().splitlines()
    lines[0] = "Ein großes rotes Quadrat links vor weißem Hintergrund."
    path.write_bytes(gzip.compress(("\n".join(lines) + "\n").encode()))
    return f"{path.relative_to(workdir)}:1"


def replace_one_image(workdir: Path) -> str:
    from PIL import Image

    path = sorted((workdir / "raw" / "embedded" / "images").glob("train-*.jpg"))[5]
    with Image.open(path) as image:
        image.transpose(Image.Transpose.FLIP_LEFT_RIGHT).save(path)
    return str(path.relative_to(workdir))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--keep", help="workdir to keep (default: a temporary one, removed)")
    args, extra = parser.parse_known_args()
    if any(a.startswith("--dataset") for a in extra):
        sys.exit("this benchmark edits the Multi30K-style demo's files: run it without --dataset")
    workdir = empty_workdir(args.keep)
    import torch

    print(f"machine: {platform.node()}, {os.cpu_count()} CPUs, {platform.processor() or platform.machine()}, "
          f"torch {torch.__version__}, python {platform.python_version()}")  # fmt: skip
    print(f"command: mule demo --workdir <dir> {' '.join(extra)}  (each run a new process)\n")
    rows = []
    for label, change in (("full rebuild (empty workdir)", None), ("no change", None),
                          ("one caption edited", edit_one_caption), ("one image replaced", replace_one_image)):  # fmt: skip
        what = change(workdir) if change else ""
        wall, stdout = run_demo(workdir, extra)
        stages, mean = decisions(stdout)
        ran = [s for s, d in stages.items() if d.startswith("ran")]
        rows.append((label + (f": {what}" if what else ""), wall, ran, mean))
        print(f"{label}{f' ({what})' if what else ''}: {wall:.1f} s")
        for stage, decision in stages.items():
            print(f"    {stage:<10} {decision}")
        print(f"    {mean}\n")
    print("| rebuild | seconds | stages that ran |\n|---|---|---|")
    for label, wall, ran, _ in rows:
        print(f"| {label} | {wall:.1f} | {', '.join(ran) or 'none'} |")
    if not args.keep:
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
