"""Between the catalog and mule_core: vocabularies, split tensors, model files.

A model file holds the weights and everything needed to use it on its own: the
config, the languages and each language's vocabulary.
"""

from __future__ import annotations

import hashlib
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from data_catalog import queries
from data_catalog.atomic import write_atomic
from data_catalog.catalog import Catalog
from mule_core.config import MuleConfig, from_dict, to_dict
from mule_core.errors import InputError, MissingInputError
from mule_core.model import MuleModel
from mule_core.text import Vocab, pad_batch
from mule_core.training import SplitTensors

MODEL_FORMAT = "mule-model-1"


@dataclass
class Vocabulary:
    languages: list[str]
    vocabs: dict[str, Vocab]
    vectors: dict[str, torch.Tensor] | None = None  # None for a vocabulary read from a model file

    @property
    def dim(self) -> int:
        return next(iter(self.vectors.values())).shape[1]

    @property
    def sizes(self) -> dict[str, int]:
        return {lang: len(v) for lang, v in self.vocabs.items()}


def load_vocabulary(catalog: Catalog, dataset: str, languages: list[str] | tuple[str, ...]) -> Vocabulary:
    table = queries.word_vectors(catalog, dataset)
    langs = table["lang"].to_numpy(zero_copy_only=False)
    tokens = table["token"].to_pylist()
    vectors = table["vector"].combine_chunks()
    flat = vectors.flatten().to_numpy(zero_copy_only=False)
    dim = len(vectors[0]) if len(vectors) else 0
    flat = flat.reshape(-1, dim)
    out_vocabs, out_vectors, used = {}, {}, []
    for lang in languages:
        rows = np.nonzero(langs == lang)[0]
        if len(rows) == 0:
            continue
        out_vocabs[lang] = Vocab([tokens[i] for i in rows])
        out_vectors[lang] = torch.from_numpy(flat[rows].astype(np.float32))
        used.append(lang)
    if not used:
        raise InputError(f"no word vectors for {list(languages)} in dataset {dataset!r}: run the text stage first")
    return Vocabulary(used, out_vocabs, out_vectors)


def load_split(
    catalog: Catalog,
    dataset: str,
    selector: str,
    vocabulary: Vocabulary,
    max_tokens: int,
    features: tuple[str, Any] | None = None,
    captions: str = "human",
) -> SplitTensors:
    """Captions of one split in the vocabulary's languages, as tensors.

    selector names a split (test_2016), a role (train, val, test), or "all".

    features: (extractor, reader) to attach image features; images without a file (and
    their captions) are then left out, since they have no features.

    captions: "human" (the default, and always for evaluation), "human+mt" (plus the
    translate stage's captions), "mt" (English human captions, the other languages'
    replaced by machine translations).
    """
    languages = vocabulary.languages
    rows = queries.caption_selection(catalog, dataset, selector, languages, captions)
    if rows.num_rows == 0:
        raise InputError(f"dataset {dataset!r} has no captions in split {selector!r} for languages {languages}")
    image_col = rows["image_id"].to_pylist()
    keep = np.ones(len(image_col), dtype=bool)
    if features is not None:
        # Only images with features: a missing or unreadable file (in rejects) has none.
        available = catalog.extracted_image_ids(dataset, features[0])
        keep = np.asarray([bool(f) and i in available for i, f in zip(image_col, rows["has_file"].to_pylist())])
        left_out = {i for i, k in zip(image_col, keep) if not k}
        if left_out:
            logging.getLogger("mule.tasks").warning(
                "%s: %d images have no features (no file, or a file that does not decode: see the rejects "
                "table) and are left out with their %d captions", selector, len(left_out), int((~keep).sum()),
            )  # fmt: skip
    image_ids = sorted({img for img, k in zip(image_col, keep) if k})
    image_row = {img: i for i, img in enumerate(image_ids)}
    lang_index = {lang: i for i, lang in enumerate(languages)}
    lang_col, token_col, id_col = rows["lang"].to_pylist(), rows["tokens"].to_pylist(), rows["caption_id"].to_pylist()
    encoded, caption_image, caption_lang, caption_ids = [], [], [], []
    for img, lang, tokens, caption_id, k in zip(image_col, lang_col, token_col, id_col, keep):
        if k:
            encoded.append(vocabulary.vocabs[lang].encode(tokens))
            caption_image.append(image_row[img])
            caption_lang.append(lang_index[lang])
            caption_ids.append(caption_id)
    tokens, lengths = pad_batch(encoded, max_tokens)
    matrix = None
    if features is not None:
        extractor, reader = features
        matrix = torch.from_numpy(np.ascontiguousarray(reader(extractor, image_ids), dtype=np.float32))
    return SplitTensors(
        languages, tokens, lengths, np.asarray(caption_lang, np.int64), np.asarray(caption_image, np.int64), image_ids,
        matrix, caption_ids,
    )  # fmt: skip


def build_model(cfg: MuleConfig, vocabulary: Vocabulary, image_dim: int | None) -> MuleModel:
    model = MuleModel(vocabulary.languages, vocabulary.sizes, vocabulary.dim, image_dim, cfg.model)
    for lang, vectors in vocabulary.vectors.items():
        model.branches[lang].init_vectors(vectors)
    return model


def file_digest(path: Path) -> str | None:
    if not path.exists():
        return None
    return hashlib.sha256(path.read_bytes()).hexdigest()[:16]


def model_digest(path: Path) -> str | None:
    """The content of a saved model (weights and vocabularies), not its file: two runs that
    trained the same weights agree, whenever they saved them."""
    if not path.exists():
        return None
    data = torch.load(path, map_location="cpu", weights_only=True)
    digest = hashlib.sha256(repr(sorted(data["vocab"].items())).encode())
    for name, tensor in sorted(data["state_dict"].items()):
        digest.update(name.encode())
        digest.update(tensor.contiguous().numpy().tobytes())
    return digest.hexdigest()[:16]


def save_atomic(obj: Any, path: Path) -> None:
    write_atomic(path, lambda tmp: torch.save(obj, tmp))


def save_model(path: Path, model: MuleModel, cfg: MuleConfig, vocabulary: Vocabulary, **meta: Any) -> None:
    save_atomic(
        {
            "format": MODEL_FORMAT,
            "state_dict": {k: v.detach().cpu() for k, v in model.state_dict().items()},
            "config": to_dict(cfg),
            "languages": vocabulary.languages,
            "vocab": {lang: v.tokens for lang, v in vocabulary.vocabs.items()},
            "word_dim": vocabulary.dim,
            "image_dim": model.image_mean.numel() if model.image_branch is not None else None,
            "created": time.time(),
            **meta,
        },
        path,
    )


def load_model(path: Path) -> tuple[MuleModel, dict]:
    if not path.exists():
        raise MissingInputError(f"no trained model at {path}: run the train stage first (mule run train)")
    data = torch.load(path, map_location="cpu", weights_only=True)
    if data.get("format") != MODEL_FORMAT:
        raise InputError(f"{path} is not a mule model file (format {data.get('format')!r})")
    cfg = from_dict(data["config"])
    vocabs = {lang: Vocab(tokens) for lang, tokens in data["vocab"].items()}
    sizes = {lang: len(v) for lang, v in vocabs.items()}
    model = MuleModel(data["languages"], sizes, data["word_dim"], data["image_dim"], cfg.model)
    model.load_state_dict(data["state_dict"])
    data["vocabulary"] = Vocabulary(list(data["languages"]), vocabs)
    data["cfg"] = cfg
    return model.eval(), data
