"""Image features: crops, averaging, extractor names, ImageNet weights offline."""

import subprocess
import sys
import time

import numpy as np
import pytest
import torch
from PIL import Image

import mule.data_catalog.weights as pretrained
from mule.data_catalog.weights import PretrainedUnavailable, imagenet_weights
from mule.mule_core.backbones import build_resnet, crop_transform, extract
from mule.mule_core.extractor_names import extractor_name


@pytest.mark.parametrize("crops", [1, 5, 10])
def test_crop_transform_shapes(crops):
    tensor = crop_transform(32, 40, crops)(Image.new("RGB", (60, 50), "blue"))
    assert tensor.shape == (crops, 3, 32, 32)


# (image width, height, mode), crop size, resize: landscape, portrait, square, odd sides
# (the centre's rounding), already at the shorter side (no resize), smaller than the crop
# (one crop: padded), and the modes images come in.
CASES = [
    ((60, 50, "RGB"), 32, 40),
    ((50, 77, "RGB"), 32, 40),
    ((64, 64, "RGB"), 32, 64),
    ((91, 47, "L"), 33, 37),
    ((37, 120, "RGBA"), 32, 37),
    ((45, 31, "P"), 24, 0),
    ((300, 200, "CMYK"), 224, 0),
    ((20, 12, "RGB"), 32, 16),
]


@pytest.mark.parametrize("crops", [1, 5, 10])
@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0][0]}x{c[0][1]}{c[0][2]}-{c[1]}px-resize{c[2]}")
def test_crops_are_torchvision_s_pixel_for_pixel(case, crops):
    """The crops are those of torchvision's Resize(shorter side) + CenterCrop / FiveCrop /
    TenCrop on the PIL image, byte for byte (what the features stage computed with them)."""
    from torchvision import transforms

    (w, h, mode), size, resize = case
    shorter = crop_transform(size, resize, 1).shorter_side
    if crops > 1 and shorter < size:
        with pytest.raises(ValueError, match=f"at least {size} px"):  # torchvision's raises too, per image
            crop_transform(size, resize, crops)
        return
    pixels = np.random.default_rng(w * h).integers(0, 256, (h, w, 4 if mode in ("RGBA", "CMYK") else 3), np.uint8)
    image = Image.fromarray(pixels[..., :3] if mode in ("RGB", "L", "P") else pixels).convert(mode)
    cropper = {1: transforms.CenterCrop, 5: transforms.FiveCrop, 10: transforms.TenCrop}[crops](size)
    theirs = cropper(transforms.Resize(shorter)(image.convert("RGB")))
    theirs = (theirs,) if crops == 1 else theirs
    want = torch.from_numpy(np.stack([np.asarray(c) for c in theirs])).permute(0, 3, 1, 2)
    got = crop_transform(size, resize, crops)(image)
    assert got.dtype == torch.uint8 and got.shape == want.shape == (crops, 3, size, size)
    assert torch.equal(got, want)


@pytest.mark.slow
def test_cropping_imports_no_torchvision():
    """torchvision costs about 2 s to import; a process that only crops and extracts with
    ONNX Runtime (the CPU's engine) or serves queries never pays it."""
    script = (
        "import sys\nfrom PIL import Image\nfrom mule.tasks.shared.extraction import ImageCrops\n"
        "from mule.mule_core.backbones import crop_transform\n"
        "crop_transform(32, 0, 10)(Image.new('RGB', (50, 40)))\nprint('torchvision' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


def test_features_are_the_mean_over_crops_and_random_weights_are_seeded():
    model = build_resnet("resnet18", None, seed=3)
    crops = torch.randn(2, 5, 3, 32, 32)
    features = extract(model, crops)
    assert features.shape == (2, 512)
    assert torch.allclose(features[0], model(crops[0]).mean(0), atol=1e-5)
    again = build_resnet("resnet18", None, seed=3)
    assert torch.equal(next(iter(again.parameters())), next(iter(model.parameters())))
    other = build_resnet("resnet18", None, seed=4)
    assert not torch.equal(next(iter(other.parameters())), next(iter(model.parameters())))


def test_extractor_name_changes_with_every_option_that_changes_features():
    base = extractor_name("resnet18", "random", 96, 0, 1, 0)
    assert base.startswith("resnet18-random-96px-1crop-")
    variants = [
        extractor_name("resnet34", "random", 96, 0, 1, 0),
        extractor_name("resnet18", "imagenet", 96, 0, 1, 0),
        extractor_name("resnet18", "random", 112, 0, 1, 0),
        extractor_name("resnet18", "random", 96, 128, 1, 0),
        extractor_name("resnet18", "random", 96, 0, 10, 0),
        extractor_name("resnet18", "random", 96, 0, 1, 1),
    ]
    assert len({base, *variants}) == 7
    assert extractor_name("resnet18", "imagenet", 96, 0, 1, 0) == extractor_name("resnet18", "imagenet", 96, 0, 1, 5)


def test_imagenet_weights_fail_fast_and_clearly_offline(tmp_path, monkeypatch):
    monkeypatch.setattr(pretrained, "_hub_checkpoint_dir", lambda: tmp_path)
    monkeypatch.setattr(pretrained, "network_reachable", lambda url, timeout=3.0: False)
    started = time.perf_counter()
    with pytest.raises(PretrainedUnavailable) as error:
        imagenet_weights("resnet152")
    message = str(error.value)
    assert "not in the local cache" in message and str(tmp_path) in message
    assert "--set features.weights=random" in message and "download.pytorch.org" in message
    assert time.perf_counter() - started < 5


def test_the_network_probe_gives_up_quickly():
    started = time.perf_counter()
    assert pretrained.network_reachable("https://192.0.2.1/weights.pth", timeout=0.5) is False  # TEST-NET-1
    assert time.perf_counter() - started < 3


def test_imagenet_weights_are_read_from_the_cache(tmp_path, monkeypatch):
    import torchvision

    monkeypatch.setattr(pretrained, "_hub_checkpoint_dir", lambda: tmp_path)
    weights = torchvision.models.get_model_weights("resnet18").DEFAULT
    full = torchvision.models.resnet18()  # stands in for the downloaded file
    torch.save(full.state_dict(), tmp_path / weights.url.rsplit("/", 1)[1])
    loaded, info = imagenet_weights("resnet18")
    assert info["weights"] == str(weights) and len(info["sha256"]) == 64
    assert torch.equal(loaded["conv1.weight"], full.state_dict()["conv1.weight"])
