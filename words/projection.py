"""Word vectors of several languages from e5's space to a model's word dimension, kept
aligned (vectors.init=multilingual-e5: the offline counterpart of the paper's pretrained
fastText and AME's aligned vectors): each word read once a machine (words/vectors.py),
each language centred as everywhere (words/common.py), one projection for all."""

from __future__ import annotations

import numpy as np

from mule.mule_core.errors import UserError
from mule.words.common import centre_words, centred
from mule.words.vectors import word_vectors

# fastText trained on the captions here gives word vectors of per-dimension std 0.35-0.43
# (Multi30K, 64-d); projected e5 vectors are scaled to that so the word learning rate and
# the MULE FC see the same magnitudes whichever start is chosen.
WORD_VECTOR_STD = 0.4


def project_aligned(vectors: dict[str, np.ndarray], dim: int, std: float = WORD_VECTOR_STD,
                    centres: dict[str, np.ndarray] | None = None) -> dict[str, np.ndarray]:  # fmt: skip
    """Word vectors of several languages from one shared space to `dim` dimensions, kept aligned.

    Each language is centred first (words/common.py: on its commonest words' rows,
    `centres`, else its own mean): e5's vectors of one language share a large common
    component (any two words score about 0.85), which would otherwise fill the leading
    directions with language identity instead of meaning. One projection,
    the principal axes of all languages' centred vectors together, then maps every
    language, so a word and its translation stay neighbours; the result is scaled to a
    per-dimension std of `std`."""
    langs = [lang for lang in vectors if len(vectors[lang])]
    if not langs:
        return {lang: np.zeros((0, dim), np.float32) for lang in vectors}
    width = next(iter(vectors[lang] for lang in langs)).shape[1]
    if dim > width:
        raise UserError(f"text.word_dim={dim} is larger than the encoder's {width} dimensions")
    centres = centres or {}
    moved = {lang: centred(vectors[lang], centres.get(lang)) for lang in langs}
    stacked = np.concatenate([moved[lang] for lang in langs]).astype(np.float64)
    _, _, axes = np.linalg.svd(stacked, full_matrices=False)
    basis = axes[:dim].T  # width x dim
    scale = std / max(float((stacked @ basis).std()), 1e-12)
    out = {lang: (moved[lang] @ basis * scale).astype(np.float32) for lang in langs}
    return out | {lang: np.zeros((0, dim), np.float32) for lang in vectors if lang not in out}


def aligned_word_vectors(words: dict[str, list[str]], dim: int, tokenizers: dict[str, str] | None = None,
                         logger=None) -> dict[str, np.ndarray]:  # fmt: skip
    """Per language, a `dim`-d vector for each word: e5's, read once a machine, centred and
    brought to the model's word dimension by project_aligned."""
    centre = {lang: centre_words(lang, tokenizers) for lang in words}
    read = {lang: word_vectors(list(ws), f"e5 words ({lang})", logger=logger) for lang, ws in words.items()}
    centres = {lang: word_vectors(ws, f"e5 words ({lang}'s centre)", logger=logger) if ws else None
               for lang, ws in centre.items()}  # fmt: skip
    return project_aligned(read, dim, centres=centres)
