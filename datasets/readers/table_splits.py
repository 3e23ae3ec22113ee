"""A table's splits: the names a split column may hold, and the split of an image the table
gives none (drawn by a hash of the seed and its id, so it never moves when rows are added)."""

from __future__ import annotations

import hashlib
import re

SPLITS = {"train": "train", "training": "train", "val": "val", "valid": "val", "validation": "val", "dev": "val",
          "test": "test", "testing": "test"}  # fmt: skip


def seeded_role(image_id: str, options) -> str:
    """val, test or train for an image without a given split: by a hash of the seed and its
    id alone, so an image keeps its split whatever rows are added. `options`: a TableOptions
    (split_seed, val_share, test_share)."""
    digest = hashlib.sha256(f"{options.split_seed}:{image_id}".encode()).digest()
    share = int.from_bytes(digest[:8], "big") / 2**64
    if share < options.val_share:
        return "val"
    return "test" if share < options.val_share + options.test_share else "train"


def split_role(value: str) -> tuple[str, str] | None:
    """A split cell -> (split name, role), or None when it names no split."""
    name = str(value).strip().lower()
    if name in SPLITS:
        return SPLITS[name], SPLITS[name]
    if re.fullmatch(r"test[_-][a-z0-9_-]+", name):
        return name.replace("-", "_"), "test"
    return None
