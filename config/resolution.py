"""One config per run, resolved once: a preset, a dataset's defaults, then the overrides.

    cfg = resolve("demo", {"train.epochs": 3, "loss.lc": "false"})
    cfg = resolve(None, {"data.dataset": "multi30k"})  # the dataset's preset: here "default"
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mule.config.overrides import apply_overrides
from mule.config.presets import PRESETS
from mule.config.sections import DataConfig, MuleConfig
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


def default_preset(dataset: str) -> str:
    """The preset of a run that names none: "demo" for the generated Multi30K-style
    dataset (what `mule demo` makes, at any size), "default" for every other."""
    return "demo" if dataset == "embedded" else "default"


def resolve(preset: str | None = None, overrides: dict[str, Any] | None = None) -> MuleConfig:
    """The config of a preset (None: default_preset of the dataset) with these overrides."""
    if preset is None:
        preset = default_preset(str((overrides or {}).get("data.dataset", DataConfig.dataset)))
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
