"""Image features: crops, averaging, extractor names, ImageNet weights offline."""

import time

import pytest
import torch
from PIL import Image

import mule.data_catalog.weights as pretrained
from mule.data_catalog.weights import PretrainedUnavailable, imagenet_weights
from mule.mule_core.extractor_names import extractor_name
from mule.mule_core.features import build_resnet, crop_transform, extract


@pytest.mark.parametrize("crops", [1, 5, 10])
def test_crop_transform_shapes(crops):
    tensor = crop_transform(32, 40, crops)(Image.new("RGB", (60, 50), "blue"))
    assert tensor.shape == (crops, 3, 32, 32)


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
