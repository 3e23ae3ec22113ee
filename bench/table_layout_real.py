"""The table layout on the real published captions: the official Multi30K text and the
COCO-CN 201805 release (../shared/datasets) are each ingested by their native reader,
written into the table layout (Multi30K as captions.csv, COCO-CN as Hugging Face's
metadata.jsonl), with a stand-in image per image (one small JPEG, hard-linked: the
real images are not in ../shared), and ingested again by the table reader. Prints both
ingests' counts and times and every caption that differs in image, language, text,
tokens or split.

    python bench/table_layout_real.py [--shared ../shared/datasets] [--work DIR] [--only multi30k|coco-cn]
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import platform
import shutil
import tarfile
import tempfile
import time
from collections import Counter
from pathlib import Path

from PIL import Image

from mule.config.resolution import resolve
from mule.data_catalog.tables import Catalog
from mule.pipeline.runner import run_alone
from mule.storage.workdir import Workdir


def ingest(work: Path, overrides: dict) -> tuple[list[tuple], dict, float]:
    wd = Workdir.at(work)
    cfg = resolve("demo", overrides)
    started = time.perf_counter()
    summary = run_alone(wd, cfg, "ingest")
    seconds = time.perf_counter() - started
    table = Catalog(wd, read_only=True).read_table("captions", cfg.data.dataset).to_pydict()
    rows = list(zip(table["image_id"], table["lang"], table["text"], map(tuple, table["tokens"]), table["split"]))
    return rows, summary, seconds


def stand_in_images(folder: Path, names: list[str]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    one = folder / ".stand-in.jpg"
    Image.new("RGB", (16, 12), (90, 120, 150)).save(one, quality=90)
    for name in names:
        target = folder / name
        target.parent.mkdir(parents=True, exist_ok=True)
        if not target.exists():
            os.link(one, target)


def compare(name: str, native: tuple, table: tuple, key) -> None:
    (a, sa, ta), (b, sb, tb) = native, table
    a_set = Counter((key(r[0]), *r[1:]) for r in a)
    b_set = Counter(b)
    # the table reader rejects a row that repeats an earlier one (image, language, caption);
    # the native readers keep each line of the published files, repeats included
    repeats = Counter({k: n - 1 for k, n in Counter((k[0], k[1], k[2]) for k in a_set.elements()).items() if n > 1})
    a_set = Counter({k: 1 if (k[0], k[1], k[2]) in repeats else n for k, n in a_set.items()})
    only_native, only_table = a_set - b_set, b_set - a_set
    print(f"\n## {name}")
    print(f"native reader: {len(a):,} captions, {sa['images']:,} images, {sa['rejects']:,} rejects, ingest {ta:.1f} s")
    print(f"table layout:  {len(b):,} captions, {sb['images']:,} images, {sb['rejects']:,} rejects, ingest {tb:.1f} s")
    print("per split (native | table):")
    for split in sorted(set(sa["per_split"]) | set(sb["per_split"])):
        print(f"  {split:<20} {sa['per_split'].get(split)} | {sb['per_split'].get(split)}")
    tokens_a = sum(len(r[3]) for r in a)
    tokens_b = sum(len(r[3]) for r in b)
    print(f"tokens: {tokens_a:,} | {tokens_b:,}; tokenisers {sb['tokenizers']}")
    kinds = Counter(sb.get("rejects_by_kind", {}))
    print(f"repeated captions in the published files (same image, language and text): {sum(repeats.values())}; "
          f"the table reader's duplicate rejects: {kinds.get('duplicate', 0)}; other rejects: "
          f"{sum(kinds.values()) - kinds.get('duplicate', 0)}")  # fmt: skip
    print(f"captions, repeats counted once, only in the native ingest: {sum(only_native.values())}; "
          f"only in the table's: {sum(only_table.values())}")  # fmt: skip
    for row in list(only_native)[:5]:
        print("  native only:", row)
    for row in list(only_table)[:5]:
        print("  table only: ", row)


def multi30k(shared: Path, work: Path) -> None:
    source = shared / "multi30k"
    languages = "en,de,fr,cs"
    native = ingest(work / "native-multi30k", {"data.dataset": "multi30k", "data.source": str(source),
                                               "data.languages": languages})  # fmt: skip
    folder = work / "multi30k-table"
    images = sorted({r[0] for r in native[0]})
    stand_in_images(folder / "images", images)
    with open(folder / "captions.csv", "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(["file_name", "caption", "lang", "split"])
        for image, lang, text, _tokens, split in native[0]:
            writer.writerow([f"images/{image}", text, lang, split])
    table = ingest(work / "table-multi30k", {"data.dataset": "multi30k-table", "data.source": str(folder),
                                             "data.languages": languages})  # fmt: skip
    compare("Multi30K (official text files; captions.csv)", native, table, lambda image: f"images/{image}")


def coco_cn(shared: Path, work: Path) -> None:
    archive = shared / "coco-cn" / "coco-cn-version1805.tar.gz"
    unpacked = work / "coco-cn-release"
    if not unpacked.exists():
        with tarfile.open(archive) as tar:
            tar.extractall(unpacked, filter="data")
    native = ingest(work / "native-coco-cn", {"data.dataset": "coco", "data.source": str(unpacked),
                                              "data.languages": "zh", "data.coco_split": "coco-cn"})  # fmt: skip
    folder = work / "coco-cn-table"
    stand_in_images(folder, sorted({f"{r[0]}.jpg" for r in native[0]}))
    with open(folder / "metadata.jsonl", "w", encoding="utf-8") as f:
        for image, lang, text, _tokens, split in native[0]:
            f.write(json.dumps({"file_name": f"{image}.jpg", "caption": text, "lang": lang, "split": split},
                               ensure_ascii=False) + "\n")  # fmt: skip
    table = ingest(work / "table-coco-cn", {"data.dataset": "coco-cn-table", "data.source": str(folder),
                                            "data.languages": "zh"})  # fmt: skip
    compare("COCO-CN 201805 (imageid.caption.txt + manual translations; metadata.jsonl)", native, table,
            lambda image: f"{image}.jpg")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shared", default=str(Path(__file__).resolve().parents[2] / "shared" / "datasets"))
    parser.add_argument("--work", help="where the workdirs and tables go (default: a temporary folder, removed)")
    parser.add_argument("--only", choices=("multi30k", "coco-cn"))
    args = parser.parse_args()
    work = Path(args.work) if args.work else Path(tempfile.mkdtemp(prefix="table-real-"))
    print(f"machine: {platform.node()}, {os.cpu_count()} CPUs; work {work}")
    try:
        if args.only in (None, "multi30k"):
            multi30k(Path(args.shared), work)
        if args.only in (None, "coco-cn"):
            coco_cn(Path(args.shared), work)
    finally:
        if not args.work:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
