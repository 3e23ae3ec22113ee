"""A model file opened as a function (mule_core.embedder.Embedder), with the file I/O it
needs wired in: images opened safely (datasets.image_files) and the image extractor's
weights read when the first image comes (data_catalog.weights). mule.api.load's file
step, so what `mule search`, `mule serve` and the registered MLflow model use; no stage does.

    embedder = open_embedder(path)
    embedder.encode_text("ein roter Kreis"), embedder.encode_image(Path("photo.jpg"))
"""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path

import torch

from mule.data_catalog.exported_models import is_model_folder, read_model_folder
from mule.data_catalog.model_files import load_model
from mule.datasets.image_files import BadImage, TooManyPixels, load_rgb
from mule.mule_core.embedder import Embedder, EmbedError
from mule.mule_core.settings import ModelSettings


def open_embedder(path: Path, label: str | None = None, weights_file: str | None = None,
                  device: torch.device | None = None):  # fmt: skip
    """The model file as a function (mule_core.embedder.Embedder), with the file I/O it
    needs wired in: images opened safely (datasets.image_files) and the image extractor's
    weights read when the first image comes (data_catalog.weights). `weights_file`: where
    the extractor's weights are now (a registered model carries its own copy)."""
    if is_model_folder(Path(path)):  # an exported folder (mule export): its own copy of the extractor's weights
        model, meta = read_model_folder(Path(path))
        weights_file = weights_file or meta.get("extractor_weights_file")
    else:
        model, meta = load_model(Path(path))
    meta["file"] = Path(path)  # what it was read from (a gallery index names its model by the file's sha256)
    if weights_file:
        cfg = meta["cfg"]
        meta["cfg"] = dataclasses.replace(
            cfg, features=dataclasses.replace(cfg.features, weights_file=str(weights_file))
        )
    embedder = Embedder(model, meta, label or str(path), device or torch.device("cpu"), _network_loader(meta),
                        open_query_image)  # fmt: skip
    for lang, (trained, installed) in embedder.tokenizer_drift().items():
        logging.getLogger("mule.api").warning(
            "%s: its %s captions were tokenised by %s; installed here: %s. A sentence may be split into other words "
            "than in training (install the version it names to serve it as it was measured)",
            embedder.label, lang, trained, installed)  # fmt: skip
    return embedder


def open_onnx_embedder(folder: Path, label: str | None = None, int8: bool = False):
    """An exported folder's ONNX towers under ONNX Runtime (mule_core.onnx_embedder): the same
    calls as open_embedder's, images opened the same way."""
    from mule.data_catalog.exported_models import tower_file
    from mule.mule_core.errors import MissingInputError
    from mule.mule_core.onnx_embedder import OnnxEmbedder
    from mule.mule_core.onnx_towers import OnnxSession

    model, meta = read_model_folder(Path(folder))
    meta["file"] = Path(folder)
    text = tower_file(folder, "text", int8)
    if text is None:
        raise MissingInputError(f"{folder}: no {'int8 ' if int8 else ''}ONNX text tower (textual/); "
                                "export it again without --no-onnx")  # fmt: skip
    image = tower_file(folder, "image", int8) if model.image_branch is not None else None
    return OnnxEmbedder(model, meta, label or f"{folder} (ONNX{', int8' if int8 else ''})", torch.device("cpu"),
                        None, open_query_image, text=OnnxSession(str(text)),
                        image=OnnxSession(str(image)) if image else None, int8=int8)  # fmt: skip


def _network_loader(meta: dict):
    """The model's extractor, run by the engine its gallery's features were made by (ONNX
    Runtime and PyTorch agree within 1e-4, not bit for bit)."""
    from mule.mule_core.backbones import engine_of

    cfg: ModelSettings = meta["cfg"]
    engine = engine_of(meta.get("extractor_numerics"))

    def load(device: torch.device):
        from types import SimpleNamespace

        from mule.data_catalog.weights import load_extractor

        chosen = engine if engine != "onnxruntime" or device.type == "cpu" else "torch"
        return load_extractor(SimpleNamespace(**dataclasses.asdict(cfg.features), engine=chosen), device)

    return load


def open_query_image(source: Path | bytes, min_side: int, max_pixels: int, max_bytes: int | None = None):
    """An image given to a model (a file or an upload's bytes), opened as the catalog's are,
    within a pixel budget read from its header, and a budget of the bytes it decodes to
    (by default what that many RGB pixels take: a 16-bit RGBA or float image of as many
    pixels decodes to more, and is refused); what cannot be used is an EmbedError that says
    why (and never shows a traceback)."""
    what = "the upload" if isinstance(source, bytes) else str(source)
    try:
        return load_rgb(source, min_side=min_side, max_pixels=max_pixels,
                        max_bytes=3 * max_pixels if max_bytes is None else max_bytes)  # fmt: skip
    except FileNotFoundError:
        raise EmbedError(f"{source}: no such image file", "not found") from None
    except TooManyPixels as error:
        raise EmbedError(f"{what}: {error.reason}", "too large") from None
    except BadImage as error:
        raise EmbedError(f"{what}: not an image that can be read ({error.reason})", "not an image") from None
