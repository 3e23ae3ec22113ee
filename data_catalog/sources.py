"""From a dataset name to where its raw files are: the embedded datasets are generated into
the workdir (datasets.generated writes them); any other dataset is read from the
folder the user names. Kept apart from the generators: the stages that only read the raw
files (ingest, translate) are not keyed by the generators' code."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from mule.mule_core.errors import UserError
from mule.storage.workdir import Workdir


class DatasetLocation(Protocol):
    """What locating a dataset reads of the pipeline's data section (config.sections.DataConfig)."""

    dataset: str
    source: str
    images: str

EMBEDDED = "embedded"  # Multi30K-style: en, de, fr, cs
EMBEDDED_COCO = "embedded-coco"  # COCO-style: en on every image, ja and zh on few
EMBEDDED_TABLE = "embedded-table"  # the table layout: en and es captions in one CSV
GENERATED = (EMBEDDED, EMBEDDED_COCO, EMBEDDED_TABLE)
# The table layout's file when data.table names none, looked for in this order: Hugging
# Face's imagefolder metadata first, then a captions table (datasets/readers/table.py)
TABLE_NAMES = ("metadata.jsonl", "metadata.csv", "metadata.parquet",
               "captions.csv", "captions.tsv", "captions.jsonl", "captions.parquet")  # fmt: skip


class DatasetError(UserError, ValueError):
    pass


@dataclass(frozen=True)
class DatasetSource:
    name: str
    root: Path
    images: Path
    generated: bool


def table_in(root: Path, name: str = "") -> Path | None:
    """The captions table of a table-layout folder (`name`, else the first of TABLE_NAMES
    there), or None."""
    if name:
        path = root / name
        return path if path.is_file() else None
    return next((root / n for n in TABLE_NAMES if (root / n).is_file()), None)


def locate(workdir: Workdir, data: DatasetLocation) -> DatasetSource:
    """Where the raw files are, without creating anything."""
    if data.source:
        root = Path(data.source).expanduser().resolve()
        if not root.exists():
            raise DatasetError(f"dataset source {root} does not exist")
        generated = False
    elif data.dataset in GENERATED:
        root, generated = workdir.raw_dir(data.dataset), True
    else:
        raise DatasetError(
            f"dataset {data.dataset!r} needs its raw files: pass --source PATH "
            f"(e.g. mule run ingest --dataset multi30k --source ../shared/datasets/multi30k); "
            f"the generated datasets are {' and '.join(GENERATED)}"
        )
    images = Path(data.images).expanduser().resolve() if data.images else root / "images"
    return DatasetSource(data.dataset, root, images, generated)
