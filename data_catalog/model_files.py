"""Model files: a trained (or LP) model's weights with everything needed to use it on its
own: the config, the languages, each language's vocabulary, the image extractor's name.

    save_model(path, model, cfg, vocabulary, kind="joint", ...)
    model, meta = load_model(path)          # meta["cfg"], meta["vocabulary"], meta["extractor"], ...

A file keeps the whole config the model was trained under ("config": the pipeline's, as a
dict); `meta["cfg"]` is what using the model needs of it (mule_core.settings.ModelSettings:
the model, the text's length, the image extractor's setting).

Files are written atomically and read without pickle (torch's weights_only loader).
"""

from __future__ import annotations

import dataclasses
import hashlib
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from mule.mule_core.errors import InputError, MissingInputError
from mule.mule_core.model import MuleModel, table_names, word_dims
from mule.mule_core.settings import settings_from_dict
from mule.mule_core.table_precision import loaded_tables, stored_tables
from mule.mule_core.vocabulary import Vocab, Vocabulary
from mule.storage.atomic import write_atomic

MODEL_FORMAT = "mule-model-1"


def save_atomic(obj: Any, path: Path) -> None:
    write_atomic(path, lambda tmp: torch.save(obj, tmp))


def save_model(path: Path, model: MuleModel, cfg: Any, vocabulary: Vocabulary, tables: Mapping[str, str] | None = None,
               **meta: Any) -> None:  # fmt: skip
    """`cfg`: the config it was trained under (the pipeline's MuleConfig): every section the
    training stage was given (its declared ones). `tables`: languages whose word and n-gram
    tables are stored in float16 or int8 (output.tables; mule_core.table_precision), the
    others' in float32; mule_core.model.round_tables rounds the model itself first, so what
    loads is what was measured."""
    tables = {lang: p for lang, p in (tables or {}).items() if p != "float32"}
    stored = {k: v.detach().cpu() for k, v in model.state_dict().items()}
    stored = stored_tables(stored, {name: p for lang, p in tables.items() for name in table_names(model, lang)})
    dims = word_dims(model)
    save_atomic(
        {
            "format": MODEL_FORMAT,
            "state_dict": stored,
            "config": {f.name: dataclasses.asdict(v) if dataclasses.is_dataclass(v) else v
                       for f in dataclasses.fields(cfg) if dataclasses.is_dataclass(v := getattr(cfg, f.name))
                       or isinstance(v, (str, int, float))},  # fmt: skip
            "languages": vocabulary.languages,
            "vocab": vocabulary.words,
            "word_dim": dims[model.languages[0]],
            "word_dims": dims,  # each language's: an added language's is narrower
            "tables": tables,  # each language's tables' precision where not float32
            "image_dim": model.image_mean.numel() if model.image_branch is not None else None,
            "created": time.time(),
            **meta,
        },
        path,
    )


def load_model(path: Path) -> tuple[MuleModel, dict]:
    path = Path(path)
    if not path.exists():
        raise MissingInputError(f"no trained model at {path}: run the train stage first (mule run train)")
    data = torch.load(path, map_location="cpu", weights_only=True)
    if data.get("format") != MODEL_FORMAT:
        raise InputError(f"{path} is not a mule model file (format {data.get('format')!r})")
    cfg = settings_from_dict(data["config"])
    lengths = tuple(cfg.model.ngram_lengths) if cfg.model.subwords else ()
    vocabulary = Vocabulary(list(data["languages"]), {lang: Vocab(tokens) for lang, tokens in data["vocab"].items()},
                            ngram_lengths=lengths)  # fmt: skip
    model = MuleModel(data["languages"], vocabulary.sizes, word_widths(data), data["image_dim"], cfg.model,
                      vocabulary.words)  # fmt: skip
    model.load_state_dict(loaded_tables(data["state_dict"]))  # float16 and int8 tables become the model's float32
    data["vocabulary"] = vocabulary
    data["cfg"] = cfg
    return model.eval(), data


def table_precisions(data: dict) -> dict[str, str]:
    """Each language's stored table precision where not float32 (files of before int8 list
    their float16 languages as "half_tables")."""
    return dict(data.get("tables") or {lang: "float16" for lang in data.get("half_tables", [])})


def word_widths(data: dict) -> int | dict[str, int]:
    """A model file's word widths: each language's, or (files from before they differed) one for all."""
    return data.get("word_dims") or data["word_dim"]


def model_digest(path: Path) -> str | None:
    """The content of a saved model (weights and vocabularies), not its file: two runs that
    trained the same weights agree, whenever they saved them."""
    if not Path(path).exists():
        return None
    data = torch.load(path, map_location="cpu", weights_only=True)
    return weights_digest(data["vocab"], loaded_tables(data["state_dict"]))


def weights_digest(vocab: dict[str, list[str]], state_dict: dict[str, torch.Tensor]) -> str:
    """A model's identity: its vocabularies and weights (float32, as they load), however it was opened."""
    digest = hashlib.sha256(repr(sorted(vocab.items())).encode())
    for name, tensor in sorted(state_dict.items()):
        digest.update(name.encode())
        digest.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()[:16]
