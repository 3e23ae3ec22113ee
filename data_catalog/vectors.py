"""Word-vector files the user names (text.vectors): a fastText .bin (subword vectors for
any word) or a text .vec (word2vec format)."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from mule.mule_core.errors import UserError


class VectorFileError(UserError, RuntimeError):
    pass


class VectorFile:
    """Word vectors from a fastText .bin (subword vectors for any word) or a text .vec
    file (word2vec format; unknown words get None)."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path).expanduser()
        if not self.path.exists():
            raise VectorFileError(f"word-vector file {self.path} does not exist")
        self._model = None
        self._table: dict[str, np.ndarray] = {}
        if self.path.suffix == ".bin":
            import fasttext

            self._model = fasttext.load_model(str(self.path))
            self.dim = self._model.get_dimension()
        else:
            self.dim = self._read_vec()

    def _read_vec(self) -> int:
        with open(self.path, encoding="utf-8", errors="strict") as handle:
            first = handle.readline().split()
            dim = int(first[1]) if len(first) == 2 and first[0].isdigit() else len(first) - 1
            if len(first) != 2:
                self._table[first[0]] = np.asarray(first[1:], dtype=np.float32)
            for number, line in enumerate(handle, start=2):
                parts = line.rstrip("\n").split(" ")
                if len(parts) != dim + 1:
                    raise VectorFileError(
                        f"{self.path}:{number}: expected a word and {dim} numbers, got {len(parts) - 1} numbers"
                    )
                self._table[parts[0]] = np.asarray(parts[1:], dtype=np.float32)
        return dim

    def vector(self, word: str) -> np.ndarray | None:
        if self._model is not None:
            return self._model.get_word_vector(word)
        return self._table.get(word)
