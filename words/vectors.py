"""multilingual-e5's vectors of single words, each word read through the encoder once per
machine.

A word's vector depends on the encoder alone (not on its language, dataset or model), so
it is kept in the user's cache (`~/.cache/mule/e5-words-<encoder>/`, float16 parts of the
words read together, written atomically) and a word read before costs nothing: about 250
words a second on 2 cores the first time (words/encoder.py: embed), a
millisecond a thousand words after. A part that cannot be read is removed and its words
read again.
"""

from __future__ import annotations

import logging
import time
import uuid
import zipfile
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from mule.mule_core.progress import Progress
from mule.storage.atomic import write_atomic
from mule.storage.code_digests import cache_dir
from mule.words import encoder

PART = 2048  # words read and kept together


def word_vectors(words: Sequence[str], label: str = "e5 words", logger=None) -> np.ndarray:
    """One L2-normalised row per word (as the cache holds it: float16 precision, so a word
    read now and one read from the cache are the same vector)."""
    folder = cache_dir() / f"e5-words-{encoder.encoder_version().replace(' ', '-')}"
    known = _cached(folder, logger)
    wanted = list(dict.fromkeys(w for w in words if w not in known))
    progress = Progress(f"{label}: {encoder.NAME}", len(wanted), "words", logger=logger)
    for start in range(0, len(wanted), PART):  # kept part by part: a stop loses one part at most
        chunk = wanted[start : start + PART]
        fresh = np.concatenate([np.atleast_2d(encoder.load_encoder().query(chunk[i : i + 512]))
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


def _cached(folder: Path, logger=None) -> dict[str, np.ndarray]:
    """The words the cache's parts hold. A part that cannot be read (empty, truncated, not
    a part: what a power cut or a full disk leaves) is removed, said in one line, and its
    words are read again."""
    found: dict[str, np.ndarray] = {}
    for part in sorted(folder.glob("part-*.npz")) if folder.is_dir() else ():
        try:
            with np.load(part, allow_pickle=False) as held:
                words, vectors = held["words"], held["vectors"]
            if words.ndim != 1 or vectors.ndim != 2 or len(words) != len(vectors) or words.dtype.kind != "U":
                raise ValueError("not a part of words and their vectors")
        except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile) as error:
            part.unlink(missing_ok=True)  # mule's own cache file: its words are read again
            (logger or logging.getLogger("mule.e5")).warning(
                "e5 word cache: %s could not be read (%s): removed, its words are read again", part,
                str(error).splitlines()[0][:120] or type(error).__name__)  # fmt: skip
            continue
        found.update(zip(words.tolist(), vectors.astype(np.float32)))
    return found


def _write_part(folder: Path, words: list[str], vectors: np.ndarray) -> None:
    """A part of the cache, written atomically (storage.atomic); a cache that cannot be
    written (read-only, full): the words are read again next time."""

    def save(tmp: Path) -> None:
        with open(tmp, "wb") as handle:  # a handle: np.savez would add .npz to the temporary's name
            np.savez(handle, words=np.array(words), vectors=vectors)

    try:
        write_atomic(folder / f"part-{time.time_ns()}-{uuid.uuid4().hex[:8]}.npz", save, crash_point=False)
    except OSError:
        pass
