"""The generated datasets: written into the workdir on first use (and again when their
generator's code changes), and their ceiling. Where a dataset's raw files are is
data_catalog.sources."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import asdict
from typing import Protocol

from mule.data_catalog.sources import EMBEDDED, EMBEDDED_COCO, EMBEDDED_TABLE, DatasetError, DatasetSource, locate
from mule.generators import coco_layout, multi30k_layout, table_layout
from mule.generators.coco_layout import CocoSpec, EmbeddedSizeError, generate_coco
from mule.generators.multi30k_layout import EmbeddedSpec, generate_multi30k
from mule.generators.table_layout import TableSpec, generate_table
from mule.mule_core.devices import cpu_threads
from mule.storage.code_digests import code_digest
from mule.storage.workdir import Workdir


class GenerationOptions(Protocol):
    """What generating a dataset reads of the pipeline's data section (config.sections.DataConfig,
    a floor above: read here, never made)."""

    dataset: str
    source: str
    train_images: int
    val_images: int
    test_images: int
    seed: int
    image_size: int


def embedded_spec(data: GenerationOptions) -> EmbeddedSpec:
    return EmbeddedSpec(data.train_images, data.val_images, data.test_images, data.seed, data.image_size)


def table_spec(data: GenerationOptions) -> TableSpec:
    return TableSpec(data.train_images, data.val_images, data.test_images, data.seed, data.image_size)


def coco_spec(data: GenerationOptions) -> CocoSpec:
    total = data.train_images + data.val_images + data.test_images
    return CocoSpec(total, data.val_images, data.test_images, data.seed, data.image_size)


# The evaluation split (name or role) -> the generator's split name.
_EMBEDDED_SPLITS = {"test": "test", "test_2016": "test", "val": "val", "train": "train"}


def embedded_ceiling(workdir: Workdir, data: GenerationOptions, split: str) -> dict[str, dict[str, float]] | None:
    """The generated dataset's ceiling on a split (embedded.ceiling), cached
    beside the dataset; None for any other dataset."""
    if data.dataset != EMBEDDED or data.source or split not in _EMBEDDED_SPLITS:
        return None
    from mule.data_catalog.tables import write_json_atomic
    from mule.generators.ceiling import ceiling

    spec, code = embedded_spec(data), code_digest("mule.generators.ceiling")
    path = workdir.state_dir / EMBEDDED / f"ceiling-{_EMBEDDED_SPLITS[split]}.json"  # derived: not in raw/
    if path.exists():
        cached = json.loads(path.read_text())
        if cached.get("spec") == asdict(spec) and cached.get("code") == code:  # same data, same generator
            return cached["table"]
    table = ceiling(spec, _EMBEDDED_SPLITS[split])
    write_json_atomic({"spec": asdict(spec), "code": code, "table": table}, path)
    return table


def generator_code(data: GenerationOptions) -> str:
    """The digest of the code that writes a generated dataset: its writer's import closure
    and the libraries it uses (Pillow encodes the images). A dataset written by other code
    is written again, as its ceiling is computed again."""
    layout = {EMBEDDED_COCO: coco_layout, EMBEDDED_TABLE: table_layout}.get(data.dataset, multi30k_layout)
    return code_digest(layout.__name__)


def generated_and_current(workdir: Workdir, data: GenerationOptions) -> bool:
    """The generated dataset is already in the workdir, made by this generator's code from
    this spec (nothing to generate)."""
    source = locate(workdir, data)
    if not source.generated:
        return True
    if data.dataset == EMBEDDED_COCO:
        return coco_layout.manifest_matches(source.root, coco_spec(data), generator_code(data))
    if data.dataset == EMBEDDED_TABLE:
        return table_layout.manifest_matches(source.root, table_spec(data), generator_code(data))
    return multi30k_layout.manifest_matches(source.root, embedded_spec(data), generator_code(data))


def prepare(workdir: Workdir, data: GenerationOptions, progress: Callable[[int, int], None] | None = None) -> DatasetSource:
    """Locates the raw files, generating the embedded dataset if it is not there yet."""
    source = locate(workdir, data)
    if source.generated and data.dataset == EMBEDDED_COCO:
        try:
            generate_coco(source.root, coco_spec(data), progress, generator_code(data))
        except EmbeddedSizeError as error:
            raise DatasetError(f"embedded-coco: {error}") from None
    elif source.generated and data.dataset == EMBEDDED_TABLE:
        generate_table(source.root, table_spec(data), progress, generator_code(data))
    elif source.generated:
        # as many processes as torch would take threads (OMP_NUM_THREADS, else the cores)
        generate_multi30k(source.root, embedded_spec(data), progress, generator_code(data), cpu_threads(0))
    return source
