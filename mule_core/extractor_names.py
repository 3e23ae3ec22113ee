"""Names of feature extractor settings (features are stored under them), without torch:
the reuse keys need them before anything heavy is imported."""

from __future__ import annotations

import hashlib
import json


def resize_for(input_size: int, resize: int) -> int:
    """Shorter side before cropping; by default the usual 256/224 ratio."""
    return resize or round(input_size * 8 / 7)


def extractor_name(arch: str, weights: str, input_size: int, resize: int, crops: int, seed: int,
                   pool: str = "avg") -> str:  # fmt: skip
    """Readable, unique name of an extractor setting: features are keyed by it."""
    key = {"arch": arch, "weights": weights, "input_size": input_size, "resize": resize_for(input_size, resize),
           "crops": crops, "seed": seed if weights == "random" else None}  # fmt: skip
    if pool != "avg":  # the paper's pooling keeps the names extractors had before pooling was an option
        key["pool"] = pool
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:8]
    return f"{arch}-{weights}-{input_size}px-{crops}crop-{digest}"
