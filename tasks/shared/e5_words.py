"""multilingual-e5's vectors of single words, each word read through the encoder once per
machine.

A word's vector depends on the encoder alone (not on its language, dataset or model), so
it is kept in the user's cache (`~/.cache/mule/e5-words-<encoder>/`, float16 parts of the
words read together, written atomically) and a word read before costs nothing: about 250
words a second on 2 cores the first time (tasks/shared/e5_vectors.py: embed), a
millisecond a thousand words after. A part that cannot be read is removed and its words
read again.
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from mule.mule_core.progress import Progress
from mule.storage.code_digests import cache_dir
from mule.tasks.shared import e5_vectors

PART = 2048  # words read and kept together


def word_vectors(words: Sequence[str], label: str = "e5 words", logger=None) -> np.ndarray:
    """One L2-normalised row per word (as the cache holds it: float16 precision, so a word
    read now and one read from the cache are the same vector)."""
    folder = cache_dir() / f"e5-words-{e5_vectors.encoder_version().replace(' ', '-')}"
    known = _cached(folder)
    wanted = list(dict.fromkeys(w for w in words if w not in known))
    progress = Progress(f"{label}: {e5_vectors.NAME}", len(wanted), "words", logger=logger)
    for start in range(0, len(wanted), PART):  # kept part by part: a stop loses one part at most
        chunk = wanted[start : start + PART]
        fresh = np.concatenate([np.atleast_2d(e5_vectors.load_encoder().query(chunk[i : i + 512]))
                                for i in range(0, len(chunk), 512)]).astype(np.float16)  # fmt: skip
        _write_part(folder, chunk, fresh)
        known.update(zip(chunk, fresh.astype(np.float32)))
        progress.update(len(chunk))
    if wanted:
        progress.finish()
    width = len(next(iter(known.values()))) if known else 0
    out = np.empty((len(words), width), np.float32)
    for i, word in enumerate(words):
        out[i] = known[word]
    return out


def _cached(folder: Path) -> dict[str, np.ndarray]:
    found: dict[str, np.ndarray] = {}
    for part in sorted(folder.glob("part-*.npz")) if folder.is_dir() else ():
        try:
            with np.load(part, allow_pickle=False) as held:
                words, vectors = held["words"], held["vectors"]
            if words.ndim != 1 or vectors.ndim != 2 or len(words) != len(vectors):
                raise ValueError("not a part of words and their vectors")
        except (OSError, ValueError, KeyError):
            part.unlink(missing_ok=True)  # mule's own cache file: its words are read again
            continue
        found.update(zip(words.tolist(), vectors.astype(np.float32)))
    return found


def _write_part(folder: Path, words: list[str], vectors: np.ndarray) -> None:
    try:
        folder.mkdir(parents=True, exist_ok=True)
        tmp = folder / f".part-{uuid.uuid4().hex}.tmp.npz"
        np.savez(tmp, words=np.array(words), vectors=vectors)
        os.replace(tmp, folder / f"part-{time.time_ns()}-{uuid.uuid4().hex[:8]}.npz")
    except OSError:  # a cache that cannot be written: the words are read again next time
        pass
