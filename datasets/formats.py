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

from mule.data_catalog.sources import table_in
from mule.datasets.readers.base import ReadOptions, ReadResult
from mule.datasets.readers.coco import CocoOptions, read_coco
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
        Format("multi30k", "the official Multi30K repository layout (data/task1, data/task2)", _multi30k),
        Format("coco", "MSCOCO's caption files with Japanese (YJ, STAIR) and Chinese (COCO-CN) ones", _coco),
        Format("table", "a folder of images and one captions table (metadata.jsonl/csv/parquet)", _table,
               recognises=lambda root, table: table_in(root, table) is not None),
    )
}


def recognised_format(source: Path, table: str = "") -> str | None:
    """The format of a source folder that its files name (None: the dataset's default)."""
    return next((f.name for f in FORMATS.values() if f.recognises and f.recognises(source, table)), None)
