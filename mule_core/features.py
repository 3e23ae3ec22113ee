"""Image features from a torchvision ResNet: pooled activations, averaged over crops.

The paper's extractor: ImageNet ResNet-152, 10 crops of 448 x 448, 2048-d. Which
weights to load is decided by the caller (state dict or seeded random init); this
module only builds the network and the crop transform.
"""

from __future__ import annotations

import torch
import torchvision
from PIL import Image
from torch import nn
from torchvision import transforms

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


def resize_for(input_size: int, resize: int) -> int:
    """Shorter side before cropping; by default the usual 256/224 ratio."""
    return resize or round(input_size * 8 / 7)


def build_resnet(arch: str, state_dict: dict | None = None, seed: int = 0) -> nn.Module:
    """ResNet without its classifier: outputs the pooled features (512 or 2048-d)."""
    if not hasattr(torchvision.models, arch) or not arch.startswith("resnet"):
        raise ValueError(f"unknown ResNet architecture {arch!r}")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)  # random weights are reproducible, and don't disturb the caller's RNG
        model = getattr(torchvision.models, arch)(weights=None)
    if state_dict is not None:
        model.load_state_dict(state_dict)
    model.fc = nn.Identity()
    return model.eval()


class CropTransform:
    """PIL image -> (crops x 3 x input_size x input_size) normalised tensor.

    A class rather than a closure so DataLoader workers can pickle it.
    """

    def __init__(self, input_size: int, resize: int, crops: int):
        if crops not in (1, 5, 10):
            raise ValueError(f"crops must be 1, 5 or 10, got {crops}")
        self.crops = crops
        self.resize = transforms.Resize(resize_for(input_size, resize))
        self.crop = {1: transforms.CenterCrop, 5: transforms.FiveCrop, 10: transforms.TenCrop}[crops](input_size)
        self.to_tensor = transforms.Compose([transforms.ToTensor(), transforms.Normalize(IMAGENET_MEAN, IMAGENET_STD)])

    def __call__(self, image: Image.Image) -> torch.Tensor:
        cropped = self.crop(self.resize(image.convert("RGB")))
        if self.crops == 1:
            cropped = (cropped,)
        return torch.stack([self.to_tensor(c) for c in cropped])


def crop_transform(input_size: int, resize: int, crops: int) -> CropTransform:
    return CropTransform(input_size, resize, crops)


@torch.no_grad()
def extract(model: nn.Module, crops: torch.Tensor) -> torch.Tensor:
    """(B x crops x 3 x H x W) -> (B x D): features of every crop, averaged."""
    b, n = crops.shape[:2]
    features = model(crops.flatten(0, 1))
    return features.view(b, n, -1).mean(1).float()


def extractor_name(arch: str, weights: str, input_size: int, resize: int, crops: int, seed: int) -> str:
    """Readable, unique name of an extractor setting: features are keyed by it."""
    import hashlib
    import json

    key = {"arch": arch, "weights": weights, "input_size": input_size, "resize": resize_for(input_size, resize),
           "crops": crops, "seed": seed if weights == "random" else None}  # fmt: skip
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:8]
    return f"{arch}-{weights}-{input_size}px-{crops}crop-{digest}"
