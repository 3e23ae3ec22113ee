"""mule as a library: a trained model, sentences and images in, vectors in one space out.

    from mule import api

    model = api.load("mule-work")                   # a workdir: its champion (mule demo made one)
    texts = model.encode_text(["a dog runs on the beach", "ein Hund rennt am Strand"])
    images = model.encode_image(["beach.jpg", "street.jpg"])
    scores = texts @ images.T                       # cosine similarities: rows are unit vectors

`load` takes a workdir (its champion, or `version=`/`run=`), a model file (`model.pt`, what
the train stage writes), a folder `mule export` wrote (no workdir, MLflow or network
needed), or an MLflow model URI (`models:/mule-embedded@champion`, with the
tracking URI of the store that has it). What it returns is the one object that `mule search`,
`mule serve` and the registered pyfunc model embed with (mule_core.embedder.Embedder): a
sentence's words become ids as in the evaluate stage (unseen words composed from their
character n-grams), so a caption gets the vector its evaluation measured.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["load", "Embedder", "EmbedError"]

ENGINES = ("torch", "onnxruntime")


def load(source: str | os.PathLike, *, dataset: str | None = None, version: str | None = None,
         run: str | None = None, tracking_uri: str | None = None, device: str = "cpu",
         label: str | None = None, extractor_weights: str | os.PathLike | None = None,
         engine: str = "torch", int8: bool = False):  # fmt: skip
    """The trained model at `source`, ready to encode (an Embedder). For a workdir: the
    champion of `dataset` (default: the one dataset it has a champion for), or a registered
    `version`, or a train `run`'s model. `label`: how messages name it; `extractor_weights`:
    where the image extractor's weights are now, for a model file moved without them.
    `engine="onnxruntime"`: a folder `mule export` wrote, run by its ONNX towers under ONNX
    Runtime (`int8=True`: their 8-bit variants); the same calls, vectors within 1e-5."""
    from mule.api.from_file import open_embedder, open_onnx_embedder
    from mule.mule_core.devices import resolve_device
    from mule.mule_core.settings import ConfigError  # a ValueError the command line prints as one line

    if engine not in ENGINES:
        raise ConfigError(f"engine must be one of {', '.join(ENGINES)}, got {engine!r}")
    if int8 and engine != "onnxruntime":
        raise ConfigError("int8=True runs the ONNX towers' 8-bit variants: it needs engine='onnxruntime'")
    text = os.fspath(source)
    path = Path(text).expanduser()
    from mule.data_catalog.exported_models import is_model_folder

    if engine == "onnxruntime":
        if not is_model_folder(path):
            raise ConfigError(f"{source}: engine='onnxruntime' runs the ONNX towers of a folder `mule export` "
                             "wrote (it holds them); this is not one")  # fmt: skip
        return open_onnx_embedder(path, label, int8)
    if "://" in text or text.startswith(("models:/", "runs:/")):
        return _from_mlflow(text, tracking_uri)
    if path.is_file() or is_model_folder(path):
        return open_embedder(path, label, extractor_weights, resolve_device(device))
    if path.is_dir():
        from mule.experiments.registry import resolve_model_file
        from mule.storage.workdir import Workdir

        workdir = Workdir.at(path, create=False)
        file, found = resolve_model_file(workdir, dataset or _only_dataset(workdir), run, version)
        return open_embedder(file, label or found, extractor_weights, resolve_device(device))
    raise FileNotFoundError(f"{source}: no such workdir or model file (nor an MLflow URI: models:/NAME@ALIAS)")


def _only_dataset(workdir) -> str:
    from mule.experiments import mlflow_store, tracking
    from mule.experiments.registry import CHAMPION, RegistryError

    if not mlflow_store.store_exists(workdir):
        raise RegistryError(f"no trained model in {workdir.root} (no MLflow store yet): run mule demo or mule run train")
    client = tracking.client(workdir)
    datasets = []
    for registered in client.search_registered_models("name LIKE 'mule-%'"):
        if CHAMPION in (registered.aliases or {}):
            datasets.append(registered.name.removeprefix("mule-"))
    if len(datasets) != 1:
        has = f"champions for {', '.join(sorted(datasets))}" if datasets else "no champion"
        raise RegistryError(f"{workdir.root} has {has}: say which dataset's (dataset=...)")
    return datasets[0]


def _from_mlflow(uri: str, tracking_uri: str | None):
    """A registered mule model (serving/mlflow_model.py) in any MLflow store: its own
    Embedder, as its pyfunc wrapper opened it."""
    import mlflow

    from mule.experiments.tracking import mlflow_knows_installed_packages

    if tracking_uri:
        mlflow.set_tracking_uri(tracking_uri)
    mlflow_knows_installed_packages()
    wrapped = mlflow.pyfunc.load_model(uri).unwrap_python_model()
    embedder = getattr(wrapped, "embedder", None)
    if embedder is None:
        raise ValueError(f"{uri} is not a mule model (its python model is {type(wrapped).__name__})")
    return embedder


def __getattr__(name: str):
    if name in ("Embedder", "EmbedError"):
        from mule.mule_core import embedder

        return getattr(embedder, name)
    raise AttributeError(name)
