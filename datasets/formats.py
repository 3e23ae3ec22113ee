"""The dataset formats mule reads, one entry each, keyed by `data.format`.

A format is a reader (datasets/readers/<format>.py) and how the data section's options
reach it; `recognises` lets a run that names only a source folder find its format (a
folder with a captions table is the table layout). Adding a format: its reader module,
its entry here, and the options it reads in config/sections.py's DataConfig
(docs/architecture.md, "Adding a dataset format").
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mule.data_catalog.sources import TABLE_NAMES, table_in
from mule.datasets.readers.base import ReadOptions, ReadResult
from mule.datasets.readers.coco import CocoOptions, has_coco_files, read_coco
from mule.datasets.readers.multi30k import read_multi30k
from mule.datasets.readers.table import TableOptions, read_table

# (source folder, the data section, images folder, image digest, progress, read options) -> tables
Read = Callable[[Path, Any, Path, Callable, Callable, ReadOptions], ReadResult]


@dataclass(frozen=True)
class Format:
    name: str
    summary: str
    read: Read
    # (source folder, data.table) -> whether a folder is in this layout, for a run that names no format
    recognises: Callable[[Path, str], bool] | None = None
    needs: str = ""  # what a folder in this layout holds, for the message when a folder is in none


def _multi30k(root: Path, data, images: Path, digest, progress, options: ReadOptions) -> ReadResult:
    return read_multi30k(root, data.dataset, images, digest, progress, options)


def _coco(root: Path, data, images: Path, digest, progress, options: ReadOptions) -> ReadResult:
    coco = CocoOptions(data.coco_split, data.val_images, data.test_images, data.split_seed, data.japanese)
    return read_coco(root, data.dataset, images, digest, progress, options, coco)


def _table(root: Path, data, images: Path, digest, progress, options: ReadOptions) -> ReadResult:
    # image paths: relative to the table's folder, else to the images folder
    table = TableOptions(data.table, dict(data.columns), data.encoding, data.val_share, data.test_share,
                         data.split_seed)  # fmt: skip
    return read_table(root, data.dataset, images, digest, progress, options, table)


FORMATS: dict[str, Format] = {
    f.name: f
    for f in (
        Format("multi30k", "the official Multi30K repository layout (data/task1, data/task2)", _multi30k,
               recognises=lambda root, table: (root / "data" / "task1").is_dir() or (root / "data" / "task2").is_dir(),
               needs="Multi30K's data/ tree (data/task1, data/task2: a checkout of github.com/multi30k/dataset)"),
        Format("coco", "MSCOCO's caption files with Japanese (YJ, STAIR) and Chinese (COCO-CN) ones", _coco,
               recognises=lambda root, table: has_coco_files(root),
               needs="MSCOCO's caption files (captions_*.json, or Karpathy's dataset_coco.json; Japanese and "
                     "Chinese caption files beside them), in the folder or one level below"),
        Format("table", "a folder of images and one captions table (metadata.jsonl/csv/parquet)", _table,
               recognises=lambda root, table: table_in(root, table) is not None,
               needs=f"a captions table ({', '.join(TABLE_NAMES)}, or --set data.table=NAME) with a row per "
                     "caption: image (a path under the folder or --images), text, lang"),
    )
}  # fmt: skip


def recognised_format(source: Path, table: str = "") -> str | None:
    """The format of a source folder that its files name (None: it is in none of them)."""
    return next((f.name for f in FORMATS.values() if f.recognises and f.recognises(source, table)), None)


def no_layout_message(source: Path, table: str = "") -> str:
    """What a source folder in no layout is told: each layout looked for and what it
    needs, and what the folder holds (a folder of photos alone is the usual mistake)."""
    from mule.datasets.image_files import IMAGE_SUFFIXES

    if not source.is_dir():
        return f"dataset source {source} does not exist (--source: the folder that holds the dataset's files)"
    files = [p for p in source.iterdir() if p.is_file()]
    photos = sum(p.suffix.lower() in IMAGE_SUFFIXES for p in files)
    lines = [f"{source} is in none of the dataset layouts mule reads; it looked for:"]
    lines += [f"  - {f.name}: {f.needs}" for f in FORMATS.values() if f.needs]
    if photos:
        lines.append(f"It holds {photos} image file(s) and no captions table: if these are your photos, put a "
                     f"captions.csv beside them, or point --source at the folder that holds the table and give "
                     f"--images {source}")  # fmt: skip
    elif files:
        lines.append(f"It holds {len(files)} file(s): {', '.join(sorted(p.name for p in files)[:8])}"
                     + (", ..." if len(files) > 8 else ""))  # fmt: skip
    else:
        lines.append("It holds no files.")
    lines.append("Or name the layout: --set data.format=" + "|".join(FORMATS))
    return "\n".join(lines)
