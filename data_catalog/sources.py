"""From a dataset name to where its raw files are: the embedded datasets are generated into
the workdir (data_catalog.datasets writes them); any other dataset is read from the
folder the user names. Kept apart from the generators: the stages that only read the raw
files (ingest, translate) are not keyed by the generators' code."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from mule.mule_core.errors import UserError

from .workdir import Workdir

if TYPE_CHECKING:
    from mule.pipeline.config import DataConfig

EMBEDDED = "embedded"  # Multi30K-style: en, de, fr, cs
EMBEDDED_COCO = "embedded-coco"  # COCO-style: en on every image, ja and zh on few
GENERATED = (EMBEDDED, EMBEDDED_COCO)


class DatasetError(UserError, ValueError):
    pass


@dataclass(frozen=True)
class DatasetSource:
    name: str
    root: Path
    images: Path
    generated: bool


def locate(workdir: Workdir, data: DataConfig) -> DatasetSource:
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
