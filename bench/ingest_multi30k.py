"""Ingest throughput on the real Multi30K text (../shared/datasets/multi30k by default).

    python bench/ingest_multi30k.py [PATH]

Times the reader (parse, validate, merge task1) and the tokeniser separately, without
Prefect, and prints captions per second and peak memory.
"""

from __future__ import annotations

import os
import platform
import resource
import sys
import time
from pathlib import Path

from mule.datasets.readers.multi30k import read_multi30k
from mule.mule_core.vocabulary import tokenize


def main() -> None:
    default = Path(__file__).resolve().parents[2] / "shared" / "datasets" / "multi30k"
    root = Path(sys.argv[1]) if len(sys.argv) > 1 else default
    if not (root / "data").is_dir():
        sys.exit(f"no Multi30K checkout at {root}")
    started = time.perf_counter()
    result = read_multi30k(root, "multi30k")
    read_s = time.perf_counter() - started
    texts = result.captions.column("text").to_pylist()
    langs = result.captions.column("lang").to_pylist()
    started = time.perf_counter()
    for text, lang in zip(texts, langs):
        tokenize(text, lang)
    token_s = time.perf_counter() - started
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"machine: {platform.node()}, {os.cpu_count()} CPUs, python {platform.python_version()}")
    print(f"data: {root}: {result.images.num_rows} images, {len(texts)} captions, {result.rejects.num_rows} rejects")
    print(f"read + validate + merge: {read_s:6.1f}s  ({len(texts) / read_s:,.0f} captions/s)")
    print(f"tokenise (Moses):        {token_s:6.1f}s  ({len(texts) / token_s:,.0f} captions/s)")
    print(f"peak memory: {peak_mb:,.0f} MB")
    for split, counts in result.stats.items():
        print(f"  {split:<18} {counts}")


if __name__ == "__main__":
    main()
