"""What turns an image file into a feature vector: the file opened safely, cropped, run
through the extractor's network (mule_core.backbones builds it from the weights, whose
bytes are the identity's other part), pooled and averaged over its crops.

This module's import closure is the code part of the vectors' identity
(stages.features.extractor_identity): an edit here or to anything it imports (the crops,
the backbones, the engines, how images are decoded) makes new vectors under a new
identity, and a library upgrade (torch, torchvision, timm, ONNX Runtime, Pillow) does too.
How the stage finds the weights, plans, shards and records its work (data_catalog.weights,
tasks/features.py) is not part of it: editing that reruns the stage, which finds the
vectors it already has.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import torch

from mule.datasets.image_files import BadImage, load_rgb
from mule.mule_core.backbones import crop_transform, extract, numerics

if TYPE_CHECKING:
    from mule.config.sections import FeaturesConfig


class ImageCrops:
    """(position, crops or None, error or None) per image file: a file that fails to open
    or decode is reported, not raised, so one bad JPEG never stops the stage."""

    def __init__(self, paths: list[str], f: FeaturesConfig):
        self.paths, self.transform = paths, crop_transform(f.input_size, f.resize, f.crops)

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, index: int):
        path = self.paths[index]
        try:
            image = load_rgb(path, min_side=self.transform.shorter_side)
        except FileNotFoundError:
            return index, None, "image file missing"
        except BadImage as error:
            return index, None, f"image does not decode: {error.reason}"
        with image:
            return index, self.transform(image), None


def collate(items) -> tuple[list[int], torch.Tensor | None, list[tuple[int, str]]]:
    """(positions of the good images, their crops stacked, (position, reason) of the bad)."""
    good = [(i, t) for i, t, e in items if e is None]
    bad = [(i, e) for i, _, e in items if e is not None]
    crops = torch.stack([t for _, t in good]) if good else None
    return [i for i, _ in good], crops, bad


def vectors(net, crops: torch.Tensor, device: torch.device) -> np.ndarray:
    """One vector per image of the batch (the mean over its crops), float32."""
    crops = crops.to(device, non_blocking=True)
    with torch.autocast(device.type, dtype=torch.bfloat16, enabled=numerics(device) == "bfloat16-autocast"):
        return extract(net, crops).float().cpu().numpy()
