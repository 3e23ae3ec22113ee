"""Pretrained files that live outside the workdir: torchvision ImageNet weights (torch hub
cache or download) and word-vector files (.bin / .vec).

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


class PretrainedUnavailable(RuntimeError):
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


def imagenet_weights(arch: str) -> tuple[dict, dict]:
    """State dict of torchvision's default ImageNet weights for `arch`, and a description
    (weights name, file, sha256) to record with the features."""
    import torch
    import torchvision

    weights = torchvision.models.get_model_weights(arch).DEFAULT
    file = _hub_checkpoint_dir() / os.path.basename(urlparse(weights.url).path)
    if not file.exists():
        if not network_reachable(weights.url):
            raise PretrainedUnavailable(
                f"ImageNet weights for {arch} ({weights}) are not in the local cache ({file}) and "
                f"{urlparse(weights.url).hostname} cannot be reached. Either copy the file there "
                f"(from {weights.url}), or run with random weights: --set features.weights=random"
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
    sha = hashlib.sha256(file.read_bytes()).hexdigest()
    return state, {"weights": str(weights), "file": str(file), "sha256": sha, "url": weights.url}


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
