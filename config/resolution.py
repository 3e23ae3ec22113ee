"""One config per run, resolved once: a preset, a dataset's defaults, then the overrides.

    cfg = resolve("demo", {"train.epochs": 3, "loss.lc": "false"})
    cfg = resolve(None, {"data.dataset": "multi30k"})  # the dataset's preset: here "default"
    cfg = resolve(None, {"data.dataset": "multi30k", "data.images": "photos"})  # by the photos there
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from mule.config.overrides import apply_overrides
from mule.config.presets import PRESETS
from mule.config.sections import DataConfig, MuleConfig
from mule.data_catalog.sources import GENERATED
from mule.datasets.formats import no_layout_message, recognised_format
from mule.mule_core.settings import ConfigError

# A dataset name implies its reader, languages and sampling unless they are set: the
# COCO family is English, Japanese and Chinese, unbalanced (the paper samples by language group).
_COCO = {"data.format": "coco", "data.languages": ("en", "ja", "zh"), "train.balance_language_groups": True}
DATASET_DEFAULTS: dict[str, dict[str, Any]] = {
    "coco": {**_COCO, "data.val_images": 1000, "data.test_images": 1000},
    # the generated COCO-style dataset: 5000 images, val and test drawn from its trilingual ones
    "embedded-coco": {**_COCO, "data.train_images": 4500, "data.val_images": 200, "data.test_images": 300},
    # the generated table layout: English and Spanish, a language outside the published datasets'
    "embedded-table": {"data.format": "table", "data.languages": ("en", "es")},
}


# A real dataset's preset by how many photos it has, where a run names none: (fewer than,
# preset). Measured on real Multi30K photos beside all the official text (docs/real-photos.md):
# 872 training photos gained from 10 crops and 24 epochs (few-photos), 6,993 from 10 crops
# and batches of 128 images (some-photos, every seed on val); the defaults were chosen at
# 29,000 images. The 15,000 between is not measured: about halfway in the photos' logarithm.
PHOTO_PRESETS = ((2_000, "few-photos"), (15_000, "some-photos"))


def default_preset(dataset: str, photos: int | None = None) -> str:
    """The preset of a run that names none: "demo" for the generated Multi30K-style
    dataset (what `mule demo` makes, at any size); for a dataset of real files, by its
    number of photos (PHOTO_PRESETS); "default" for every other (photos unknown, or many)."""
    if dataset == "embedded":
        return "demo"
    if photos and dataset not in GENERATED:
        return next((name for below, name in PHOTO_PRESETS if photos < below), "default")
    return "default"


def count_image_files(folder: Path) -> int:
    """How many files below `folder` are named as images (0 where it is not a folder):
    names only, nothing is opened, so 100,000 photos take a fraction of a second. (Here, not
    in datasets/image_files.py: that file is in the stages' code keys.)"""
    from mule.datasets.image_files import IMAGE_SUFFIXES

    count, pending, seen = 0, [folder], set()
    while pending:
        here = os.path.realpath(pending.pop())
        if here in seen:  # a link back up the tree is counted once
            continue
        seen.add(here)
        try:
            with os.scandir(here) as entries:
                for entry in entries:
                    if entry.is_dir():  # a linked folder too, as the readers follow it
                        pending.append(entry.path)
                    elif os.path.splitext(entry.name)[1].lower() in IMAGE_SUFFIXES:
                        count += 1
        except OSError:  # missing, not a folder, or unreadable: nothing counted there
            continue
    return count


def photos_given(overrides: dict[str, Any]) -> int:
    """The image files of the folder a run names (data.images, else <data.source>/images);
    0 when it names none or that folder has none."""
    folder = overrides.get("data.images") or (Path(str(overrides["data.source"])) / "images"
                                              if overrides.get("data.source") else None)  # fmt: skip
    return count_image_files(Path(str(folder)).expanduser()) if folder else 0


def resolve(preset: str | None = None, overrides: dict[str, Any] | None = None,
            photos: int | None = None) -> MuleConfig:
    """The config of a preset (None: default_preset of the dataset and its photos: `photos`,
    else those of the folder the overrides name) with these overrides."""
    if preset is None:
        if photos is None:
            photos = photos_given(overrides or {})
        preset = default_preset(str((overrides or {}).get("data.dataset", DataConfig.dataset)), photos)
    if preset not in PRESETS:
        raise ConfigError(f"unknown preset {preset!r}; presets are: {', '.join(PRESETS)}")
    cfg = apply_overrides(MuleConfig(preset=preset), PRESETS[preset])
    dataset = str((overrides or {}).get("data.dataset", cfg.data.dataset))
    implied = {k: v for k, v in DATASET_DEFAULTS.get(dataset, {}).items() if k not in (overrides or {})}
    source = (overrides or {}).get("data.source")
    if source and "data.format" not in (overrides or {}) and "data.format" not in implied:
        folder, table = Path(str(source)).expanduser(), str((overrides or {}).get("data.table", ""))
        found = recognised_format(folder, table)
        if not found:  # once, before any stage: each layout looked for, and what the folder holds
            raise ConfigError(no_layout_message(folder, table))
        implied["data.format"] = found
    return apply_overrides(apply_overrides(cfg, implied), overrides)
