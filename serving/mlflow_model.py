"""The trained model as an MLflow pyfunc model: what the registry's versions are.

    model = mlflow.pyfunc.load_model("models:/mule-embedded@champion")
    model.predict(pd.DataFrame({"text": ["ein roter Kreis", "a red circle"], "lang": [None, "en"]}))
    model.predict(pd.DataFrame({"image": [open("photo.jpg", "rb").read()]}))

A row is a sentence (`text`, with `lang` or without: detected from the model's own
vocabularies, as `mule search` does), or an image (`image`: its bytes; base64 in
`mlflow models serve`'s JSON). Out comes, per row, the L2-normalised vector in the shared
space (`embedding`, 512 floats), what the row was (`input`), its language and how it was
chosen, and the words the vocabulary does not know.

Requests never name files. `image_path` (a file) is read only by a model loaded
in-process with an allowed folder, `load_model(uri, model_config={"image_root": DIR})`,
and only under that folder (symbolic links resolved); any other path gets one answer,
whether or not it exists, so a client learns nothing about the host's files.

The model carries what it needs, so it installs where mule is not: mule's own code that
it imports (its import closure, under the name `mule`: MLflow's code_paths), pinned
requirements for every library that code imports, the weights and vocabularies, the
config, and a copy of the image extractor's weights file.
"""

from __future__ import annotations

import logging
import shutil
import tempfile
from importlib.metadata import version
from pathlib import Path
from typing import Any

import mlflow
import pandas as pd
from mlflow.exceptions import MlflowException
from mlflow.models import ModelSignature
from mlflow.protos.databricks_pb2 import INVALID_PARAMETER_VALUE
from mlflow.pyfunc import PythonModel
from mlflow.types.schema import Array, ColSpec, Schema

INPUTS = Schema([
    ColSpec("string", "text", required=False),
    ColSpec("string", "lang", required=False),
    ColSpec("binary", "image", required=False),
    ColSpec("string", "image_path", required=False),
])  # fmt: skip
OUTPUTS = Schema([
    ColSpec("string", "input"),  # "text" or "image"
    ColSpec("string", "lang"),  # the sentence's language ("" for an image)
    ColSpec("string", "language"),  # how it was chosen: "given" or "detected: ..."
    ColSpec(Array("string"), "unknown_words"),  # words outside the model's vocabulary
    ColSpec(Array("string"), "composed_words"),  # of those, the ones built from their character n-grams
    ColSpec(Array("float"), "embedding"),
])  # fmt: skip
SIGNATURE = ModelSignature(inputs=INPUTS, outputs=OUTPUTS)


# What the model runs: the file MLflow loads it from and the code that opens a model file.
ENTRY_MODULES = ("mule.serving.mlflow_model_entry", "mule.api", "mule.api.from_file")
NO_PATHS = ("image_path is read only by a model loaded in-process with an allowed folder "
            "(mlflow.pyfunc.load_model(uri, model_config={'image_root': DIR})); send the image's bytes in `image` "
            "(base64 in JSON)")  # fmt: skip


class MuleEmbeddings(PythonModel):
    """Sentences and images -> vectors in the shared space (see the module's doc)."""

    image_root: Path | None = None

    def load_context(self, context) -> None:
        from mule import api

        config = context.model_config or {}
        # the extractor's weights: the carried copy, not the path they had where it was trained
        self.embedder = api.load(context.artifacts["model"], label=config.get("label"),
                                 extractor_weights=context.artifacts.get("extractor_weights"))  # fmt: skip
        root = config.get("image_root")
        self.image_root = Path(root).expanduser().resolve() if root else None

    def predict(self, context, model_input: pd.DataFrame, params: dict[str, Any] | None = None) -> pd.DataFrame:
        from mule.mule_core.embedder import EmbedError

        frame = model_input if isinstance(model_input, pd.DataFrame) else pd.DataFrame(model_input)
        records = frame.to_dict("records")
        rows: list[dict | None] = [None] * len(records)
        sentences = []  # (row, text, lang): embedded together, in batches per language
        for number, row in enumerate(records):
            text, image, path = (_given(row.get(k)) for k in ("text", "image", "image_path"))
            try:
                if sum(x is not None for x in (text, image, path)) != 1:
                    raise EmbedError("give exactly one of text, image (bytes) or image_path")
                if text is not None:
                    sentences.append((number, str(text), _given(row.get("lang"))))
                else:
                    vector = self.embedder.encode_image(bytes(image) if image is not None else self._allowed(str(path)))[0]
                    rows[number] = {"input": "image", "lang": "", "language": "", "unknown_words": [],
                                    "composed_words": [], "embedding": vector.tolist()}  # fmt: skip
            except EmbedError as error:
                raise _bad_row(number, error) from None
        try:
            found = self.embedder.encode_text([t for _, t, _ in sentences], [lang for _, _, lang in sentences], details=True)
        except EmbedError as error:
            raise _bad_row(sentences[error.row][0] if error.row is not None else 0, error) from None
        for (number, _, _), vector in zip(sentences, found):
            rows[number] = {"input": "text", "lang": vector.lang, "language": vector.language,
                            "unknown_words": vector.unknown_words, "composed_words": vector.composed_words,
                            "embedding": vector.vector.tolist()}  # fmt: skip
        return pd.DataFrame(rows, columns=[c.name for c in OUTPUTS.inputs])


    def _allowed(self, path: str) -> Path:
        """The file under the allowed folder; the same error for every other path."""
        from mule.mule_core.embedder import EmbedError

        if self.image_root is None:
            raise EmbedError(NO_PATHS, "path refused")
        file = (self.image_root / path).resolve()  # an absolute path stays itself; links are followed
        if not file.is_relative_to(self.image_root):
            raise EmbedError(f"image_path {path!r} is not under the model's image_root", "path refused")
        return file


def _bad_row(index: int, error: Exception) -> MlflowException:
    return MlflowException(f"row {index + 1}: {error}", error_code=INVALID_PARAMETER_VALUE)


def _given(value: Any) -> Any:
    """None for a missing cell (None or NaN); an empty text is given, and refused as empty."""
    if value is None or (isinstance(value, float) and value != value):
        return None
    return value


def model_code(folder: Path) -> Path:
    """mule's code that the model runs (the import closure of ENTRY_MODULES, read from the
    source as the stage keys are), copied to folder/mule/<folder>/...: the code_paths
    entry, so the model imports it as `mule.serving...` wherever it is loaded."""
    from mule.storage.code_digests import REPO, closure

    modules, _ = closure(ENTRY_MODULES)
    for path in modules.values():
        target = folder / "mule" / path.relative_to(REPO)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, target)
    return folder / "mule"


def model_requirements() -> list[str]:
    """Pins for every library that code imports (its import closure's), at the versions
    installed here, and MLflow; never `mule` itself (it travels as code)."""
    from mule.storage.code_digests import closure, libraries

    _, outside = closure(ENTRY_MODULES)
    pins = libraries(outside) | {"mlflow": version("mlflow")}  # libraries() leaves out the runners
    if "onnxruntime" in pins:
        pins["onnx"] = version("onnx")  # torch's ONNX exporter, which the CPU engine calls, imports it
    return [f"{name}=={release.split('+')[0]}" for name, release in sorted(pins.items(), key=lambda p: p[0].lower())]


def log_model(tracking_uri: str, run_id: str, model_file: Path, examples: list[tuple[str, str]],
              label: str, extractor: dict[str, str], weights_file: Path | str | None = None) -> str:  # fmt: skip
    """Logs the model file as a pyfunc model of run `run_id`; returns its URI (models:/m-...),
    which the registry's versions point at. `examples`: (lang, sentence) pairs for the input
    example; `extractor`: the extractor's name and weights source, kept as metadata;
    `weights_file`: the extractor's weights (data_catalog.entries.weights_file), carried."""
    artifacts = {"model": str(model_file)}
    if weights_file:
        artifacts["extractor_weights"] = str(weights_file)
    example = pd.DataFrame({"text": [text for _, text in examples],
                            "lang": [lang if i == 0 else None for i, (lang, _) in enumerate(examples)]})  # fmt: skip
    from mule.experiments.tracking import mlflow_knows_installed_packages

    mlflow_knows_installed_packages()
    mlflow.set_tracking_uri(tracking_uri)
    quiet = logging.getLogger("mlflow.models")
    level = quiet.level
    quiet.setLevel(logging.ERROR)
    try:
        with tempfile.TemporaryDirectory(prefix="mule-model-code-") as staging, \
                mlflow.start_run(run_id=run_id, nested=True):  # fmt: skip
            info = mlflow.pyfunc.log_model(
                name="model",
                python_model=str(Path(__file__).with_name("mlflow_model_entry.py")),  # code, not a pickle
                code_paths=[str(model_code(Path(staging)))],
                artifacts=artifacts,
                signature=SIGNATURE,
                input_example=example if examples else None,
                model_config={"label": label, "image_root": ""},  # no path is read unless a loader names a folder
                metadata={
                    "mule.extractor": extractor.get("name", ""),
                    "mule.extractor_weights": extractor.get("weights", ""),
                },  # fmt: skip
                pip_requirements=model_requirements(),
            )
    finally:
        quiet.setLevel(level)
    return info.model_uri
