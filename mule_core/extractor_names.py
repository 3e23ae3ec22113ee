"""Names of feature extractors, without torch: the reuse keys need them before anything
heavy is imported.

Two names: a setting's (`extractor_name`: the options that change the vectors, so a
setting can be looked up from the config) and an identity's (`identity_name`: the setting,
the weights' digest and the extraction code's key; the features table stores vectors under
it, so vectors made another way never mix with these)."""

from __future__ import annotations

import hashlib
import json


def resize_for(input_size: int, resize: int) -> int:
    """Shorter side before cropping; by default the usual 256/224 ratio."""
    return resize or round(input_size * 8 / 7)


def setting(arch: str, weights: str, input_size: int, resize: int, crops: int, seed: int,
            pool: str = "avg") -> dict:  # fmt: skip
    """The options that change the vectors (resize as it is applied; the seed only for
    random weights)."""
    key = {"arch": arch, "weights": weights, "input_size": input_size, "resize": resize_for(input_size, resize),
           "crops": crops, "seed": seed if weights == "random" else None}  # fmt: skip
    if pool != "avg":  # the paper's pooling keeps the names extractors had before pooling was an option
        key["pool"] = pool
    return key


def extractor_name(arch: str, weights: str, input_size: int, resize: int, crops: int, seed: int,
                   pool: str = "avg") -> str:  # fmt: skip
    """Readable, unique name of an extractor setting."""
    key = setting(arch, weights, input_size, resize, crops, seed, pool)
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:8]
    return f"{arch}-{weights}-{input_size}px-{crops}crop-{digest}"


def setting_name(f) -> str:
    """extractor_name of a FeaturesConfig."""
    return extractor_name(f.arch, f.weights, f.input_size, f.resize, f.crops, f.seed, f.pool)


def identity_name(f, description: dict) -> str:
    """Readable, unique name of what made a set of vectors: the setting of FeaturesConfig
    `f` and a description of the rest (the weights' digest, the code's key)."""
    blob = json.dumps({"setting": setting(f.arch, f.weights, f.input_size, f.resize, f.crops, f.seed, f.pool),
                       **description}, sort_keys=True)  # fmt: skip
    return f"{f.arch}-{f.weights}-{f.input_size}px-{f.crops}crop-{hashlib.sha256(blob.encode()).hexdigest()[:12]}"
