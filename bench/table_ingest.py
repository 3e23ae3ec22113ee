"""The ingest stage on a large generated captions table: time, rows/s and peak resident
memory against the table's size.

    python bench/table_ingest.py [--rows 1000000] [--images 100000] [--root DIR] [--delimiter ';']
                                 [--python PY] [--repo DIR]

Generates (once; kept under --root, default /tmp/mule-table-<rows>) a folder of tiny PNGs
and a long-form captions.csv: --rows captions in Spanish and Polish over --images images,
about 60 characters each, with a few bad rows (a missing image, an empty caption, a
duplicate, an over-long caption) every 50,000 rows. Then runs the ingest stage alone
(pipeline.runner.run_alone: no Prefect, no MLflow) in a fresh process, sampling its
resident memory (and its tokenising pool's) every 50 ms, and prints one table:
the file's size, the process's memory after a ten-row table (every import made), its peak, the peak of the
process tree, seconds and rows per second.

--no-long-cells leaves the over-long caption out (the ingest of a mule from before
2026-11-27 stopped at it). --python / --repo run another checkout's mule (a worktree of the last landed commit,
for a before/after pair in the same hour).
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
WORDS = {
    "es": "un una el la perro gato niño niña rojo azul verde grande pequeño corre salta mira junto al lado de "
          "parque calle playa casa mesa silla bicicleta coche pelota árbol flor sombrero camisa".split(),
    "pl": "pies kot chłopiec dziewczynka czerwony niebieski zielony duży mały biegnie skacze patrzy obok przy "
          "parku ulicy plaży domu stole krześle rowerze samochodzie piłka drzewo kwiat kapelusz koszula".split(),
}  # fmt: skip


def generate(root: Path, rows: int, n_images: int, delimiter: str, long_cells: bool = True, seed: int = 0) -> Path:
    """The folder (made once per size and delimiter): images/, captions.csv."""
    marker = root / "generated.json"
    wanted = {"rows": rows, "images": n_images, "delimiter": delimiter, "long_cells": long_cells, "seed": seed,
              "version": 2}
    if marker.exists() and json.loads(marker.read_text()) == wanted:
        return root
    import numpy as np
    from PIL import Image

    rng = random.Random(seed)
    images = root / "images"
    images.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    for i in range(n_images):
        pixels = np.full((8, 8, 3), (i % 251, (i // 251) % 251, 7), np.uint8)
        Image.fromarray(pixels).save(images / f"{i:07d}.png")
        if i % 20000 == 0:
            print(f"  images {i:,}/{n_images:,} ({time.perf_counter() - started:.0f} s)", file=sys.stderr)
    splits = ("train",) * 8 + ("val", "test")
    previous, previous_image, previous_lang = "", 0, "es"  # the row before (a duplicate repeats it)
    with open(root / "captions.csv", "w", encoding="utf-8", newline="") as out:
        out.write(delimiter.join(("file_name", "caption", "lang", "split")) + "\n")
        for n in range(rows):
            image = n % n_images
            lang = "es" if n % 2 == 0 else "pl"
            words = rng.choices(WORDS[lang], k=rng.randint(7, 12))
            caption = " ".join(words).capitalize() + "."
            name = f"images/{image:07d}.png"
            if n % 50_000 == 17:
                name = "images/missing.png"
            elif n % 50_000 == 29:
                caption = ""
            elif n % 50_000 == 31:
                caption, lang = previous, previous_lang  # the row before's: a duplicate
                image, name = previous_image, f"images/{previous_image:07d}.png"
            elif n % 50_000 == 37 and long_cells:
                caption = "Largo " * 40_000  # 240,000 characters: past any CSV reader's default cell limit
            previous, previous_image, previous_lang = caption, image, lang
            split = splits[image % len(splits)]
            out.write(delimiter.join((name, caption, lang, split)) + "\n")
    marker.write_text(json.dumps(wanted))
    return root


CHILD = r"""
import json, os, sys, time, types
package = types.ModuleType("mule"); package.__path__ = [sys.argv[3]]; sys.modules["mule"] = package  # that checkout
import psutil
from mule.storage.workdir import Workdir
from mule.config.resolution import resolve
from mule.pipeline.runner import run_alone
# A ten-row table first: every import the stage and its runner make (MLflow's tracker, the
# tokenisers, Parquet's writer), so that the baseline is the process, not the table.
import shutil, tempfile
small = tempfile.mkdtemp()
shutil.copytree(os.path.join(sys.argv[1], "images"), os.path.join(small, "images"),
                ignore=lambda folder, names: sorted(names)[10:])
with open(os.path.join(sys.argv[1], "captions.csv"), encoding="utf-8") as full, \
        open(os.path.join(small, "captions.csv"), "w", encoding="utf-8") as out:
    out.writelines(line for n, line in zip(range(11), full))
run_alone(Workdir.at(os.path.join(small, "work")), resolve(None, {"data.dataset": "small", "data.source": small,
                                                                  "data.languages": "es,pl"}), "ingest")
shutil.rmtree(small)
print(json.dumps({"baseline_mb": psutil.Process().memory_info().rss / 2**20}), flush=True)
cfg = resolve(None, {"data.dataset": "big", "data.source": sys.argv[1], "data.languages": "es,pl"})
started = time.perf_counter()
result = run_alone(Workdir.at(sys.argv[2]), cfg, "ingest")
print(json.dumps({"seconds": time.perf_counter() - started, "captions": result["captions"],
                  "images": result["images"], "rejects": result["rejects_by_kind"]}), flush=True)
"""


def measure(python: str, repo: Path, source: Path) -> dict:
    import psutil

    with tempfile.TemporaryDirectory() as work:
        child = subprocess.Popen([python, "-c", CHILD, str(source), work, str(repo)], cwd=repo, stdout=subprocess.PIPE,
                                 text=True)  # fmt: skip
        process = psutil.Process(child.pid)
        peak = tree = 0.0
        lines: list[str] = []
        import threading

        reader = threading.Thread(target=lambda: lines.extend(child.stdout), daemon=True)
        reader.start()
        while child.poll() is None:
            try:
                own = process.memory_info().rss
                others = sum(c.memory_info().rss for c in process.children(recursive=True))
            except psutil.Error:
                break
            peak, tree = max(peak, own / 2**20), max(tree, (own + others) / 2**20)
            time.sleep(0.05)
        child.wait()
        reader.join(5)
        if child.returncode != 0:
            raise SystemExit(f"the ingest failed (exit {child.returncode})")
        out: dict = {}
        for line in lines:
            out |= json.loads(line)
        return out | {"peak_mb": peak, "tree_peak_mb": tree}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--images", type=int, default=100_000)
    parser.add_argument("--root", type=Path)
    parser.add_argument("--delimiter", default=",")
    parser.add_argument("--no-long-cells", action="store_true",
                        help="no over-long caption (a mule from before 2026-11-27 stopped its ingest at one)")
    parser.add_argument("--python", default=sys.executable)
    parser.add_argument("--repo", type=Path, default=REPO)
    args = parser.parse_args()
    root = args.root or Path(tempfile.gettempdir()) / f"mule-table-{args.rows}{'-plain' if args.no_long_cells else ''}"
    source = generate(root, args.rows, args.images, args.delimiter, not args.no_long_cells)
    size = (source / "captions.csv").stat().st_size / 2**20
    figures = measure(args.python, args.repo, source)
    growth = figures["peak_mb"] - figures["baseline_mb"]
    print(f"\n{args.rows:,} rows over {args.images:,} images; captions.csv {size:.1f} MB (delimiter {args.delimiter!r})")
    print("| mule | seconds | rows/s | RSS after a 10-row table MB | peak RSS MB | growth MB | growth / file | tree peak MB |")
    print("|---|---|---|---|---|---|---|---|")
    print(f"| {args.repo} | {figures['seconds']:.1f} | {args.rows / figures['seconds']:,.0f} | "
          f"{figures['baseline_mb']:.0f} | {figures['peak_mb']:.0f} | {growth:.0f} | {growth / size:.2f}x | "
          f"{figures['tree_peak_mb']:.0f} |")  # fmt: skip
    print(f"captions {figures['captions']:,}, images {figures['images']:,}, rejects {figures['rejects']}")


if __name__ == "__main__":
    main()
