"""The trained model as an MLflow pyfunc model: what the registry's versions are.

    model = mlflow.pyfunc.load_model("models:/mule-embedded@champion")
    model.predict(pd.DataFrame({"text": ["ein roter Kreis", "a red circle"], "lang": [None, "en"]}))
    model.predict(pd.DataFrame({"image": [open("photo.jpg", "rb").read()]}))

A row is a sentence (`text`, with `lang` or without: detected from the model's own
vocabularies, as `mule search` does), or an image (`image`: its bytes, or `image_path`:
a file). Out comes, per row, the L2-normalised vector in the shared space (`embedding`,
512 floats), what the row was (`input`), its language and how it was chosen, and the
words the vocabulary does not know. The model carries what it needs: the weights and
vocabularies (the weights-only model file), the config, and the image extractor's name
and weights source (a local weights file is carried too), so it loads in a fresh process
and under `mlflow models serve` without the workdir.
"""

from __future__ import annotations

import logging
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
    ColSpec(Array("string"), "unknown_words"),
    ColSpec(Array("float"), "embedding"),
])  # fmt: skip
SIGNATURE = ModelSignature(inputs=INPUTS, outputs=OUTPUTS)


class MuleEmbeddings(PythonModel):
    """Sentences and images -> vectors in the shared space (see the module's doc)."""

    def load_context(self, context) -> None:
        from data_catalog.embedders import open_embedder

        # the extractor's weights: the carried copy, not the path they had where it was trained
        self.embedder = open_embedder(Path(context.artifacts["model"]), (context.model_config or {}).get("label"),
                                      context.artifacts.get("extractor_weights"))  # fmt: skip

    def predict(self, context, model_input: pd.DataFrame, params: dict[str, Any] | None = None) -> pd.DataFrame:
        from mule_core.embedder import EmbedError

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
                    vector = self.embedder.image(bytes(image) if image is not None else Path(str(path)))
                    rows[number] = {"input": "image", "lang": "", "language": "", "unknown_words": [],
                                    "embedding": vector.tolist()}  # fmt: skip
            except EmbedError as error:
                raise _bad_row(number, error) from None
        try:
            found = self.embedder.texts([t for _, t, _ in sentences], [lang for _, _, lang in sentences])
        except EmbedError as error:
            raise _bad_row(sentences[error.row][0] if error.row is not None else 0, error) from None
        for (number, _, _), vector in zip(sentences, found):
            rows[number] = {"input": "text", "lang": vector.lang, "language": vector.language,
                            "unknown_words": vector.unknown_words, "embedding": vector.vector.tolist()}  # fmt: skip
        return pd.DataFrame(rows, columns=[c.name for c in OUTPUTS.inputs])


def _bad_row(index: int, error: Exception) -> MlflowException:
    return MlflowException(f"row {index + 1}: {error}", error_code=INVALID_PARAMETER_VALUE)


def _given(value: Any) -> Any:
    """None for a missing cell (None or NaN); an empty text is given, and refused as empty."""
    if value is None or (isinstance(value, float) and value != value):
        return None
    return value


def log_model(tracking_uri: str, run_id: str, model_file: Path, examples: list[tuple[str, str]],
              label: str, extractor: dict[str, str], weights_file: str | None = None) -> str:  # fmt: skip
    """Logs the model file as a pyfunc model of run `run_id`; returns its URI (models:/m-...),
    which the registry's versions point at. `examples`: (lang, sentence) pairs for the input
    example; `extractor`: the extractor's name and weights source, kept as metadata;
    `weights_file`: a local file of the extractor's weights, carried with the model."""
    import torch

    artifacts = {"model": str(model_file)}
    if weights_file:
        artifacts["extractor_weights"] = weights_file
    example = pd.DataFrame({"text": [text for _, text in examples],
                            "lang": [lang if i == 0 else None for i, (lang, _) in enumerate(examples)]})  # fmt: skip
    mlflow.set_tracking_uri(tracking_uri)
    quiet = logging.getLogger("mlflow.models")
    level = quiet.level
    quiet.setLevel(logging.ERROR)
    try:
        with mlflow.start_run(run_id=run_id, nested=True):
            info = mlflow.pyfunc.log_model(
                name="model",
                python_model=str(Path(__file__).with_name("mlflow_model_entry.py")),  # code, not a pickle
                artifacts=artifacts,
                signature=SIGNATURE,
                input_example=example if examples else None,
                model_config={"label": label},
                metadata={
                    "mule.extractor": extractor.get("name", ""),
                    "mule.extractor_weights": extractor.get("weights", ""),
                },  # fmt: skip
                pip_requirements=[f"torch=={torch.__version__.split('+')[0]}", "mule"],
            )
    finally:
        quiet.setLevel(level)
    return info.model_uri
