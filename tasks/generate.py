"""The ingest stage's preparation: a generated dataset is written before ingest's key is
taken (the key covers its files). Kept apart from tasks/ingest.py, whose tokenisers
import torch: a rebuild that finds the dataset in place imports nothing heavy."""

from __future__ import annotations

from typing import Any

from data_catalog.datasets import GENERATED, generated_and_current
from data_catalog.workdir import Workdir
from mule_core.config import from_dict


def generate_if_needed(workdir: str, config: dict[str, Any], generate: bool = True) -> bool:
    """True when there was nothing to write (not a generated dataset, or it is in place
    and current). Otherwise writes it, unless `generate` is False (only asking)."""
    data = config["data"]
    if data["dataset"] not in GENERATED or data["source"]:
        return True
    if generated_and_current(Workdir.at(workdir), from_dict(config).data):
        return True
    if generate:
        from tasks.ingest import generate_embedded

        generate_embedded(workdir, config)
    return False
