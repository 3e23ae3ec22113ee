"""From a dataset name to its raw files: the embedded dataset is generated into the
workdir on first use; any other dataset is read from the folder the user names."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from mule_core.config import DataConfig

from .embedded.multi30k_layout import EmbeddedSpec, generate_multi30k
from .workdir import Workdir

EMBEDDED = "embedded"


class DatasetError(ValueError):
    pass


@dataclass(frozen=True)
class DatasetSource:
    name: str
    root: Path
    images: Path
    generated: bool


def embedded_spec(data: DataConfig) -> EmbeddedSpec:
    return EmbeddedSpec(data.train_images, data.val_images, data.test_images, data.seed, data.image_size)


def locate(workdir: Workdir, data: DataConfig) -> DatasetSource:
    """Where the raw files are, without creating anything."""
    if data.source:
        root = Path(data.source).expanduser().resolve()
        if not root.exists():
            raise DatasetError(f"dataset source {root} does not exist")
        generated = False
    elif data.dataset == EMBEDDED:
        root, generated = workdir.raw_dir(EMBEDDED), True
    else:
        raise DatasetError(
            f"dataset {data.dataset!r} needs its raw files: pass --source PATH "
            f"(e.g. mule run ingest --dataset multi30k --source ../shared/datasets/multi30k)"
        )
    images = Path(data.images).expanduser().resolve() if data.images else root / "images"
    return DatasetSource(data.dataset, root, images, generated)


def prepare(workdir: Workdir, data: DataConfig, progress: Callable[[int, int], None] | None = None) -> DatasetSource:
    """Locates the raw files, generating the embedded dataset if it is not there yet."""
    source = locate(workdir, data)
    if source.generated:
        generate_multi30k(source.root, embedded_spec(data), progress)
    return source
