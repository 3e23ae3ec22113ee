"""Word-vector files the user names (vectors.files): a fastText .bin (subword vectors for
any word) or a text .vec (word2vec format).

A .vec is streamed once and only the words asked for are kept: fastText's cc.<lang>.300.vec
is 2 million words (4.5 GB) for a vocabulary of a few thousand, which a dict of every
word would hold whole, per language. (A .bin has no partial load: fastText reads the model
whole; it is then asked only for the vocabulary's words.)"""

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

    def __init__(self, path: str | os.PathLike, words: set[str] | None = None):
        """words: the only words a .vec's vectors are kept for (None: all of them)."""
        self.path = Path(path).expanduser()
        self.words = words
        self.lines = 0
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
        """One pass: the header (or the first vector) gives the dimension; a wanted word's line
        is parsed and checked, any other line only counted (its word read, its numbers not)."""
        wanted = self.words
        dim, number = None, 0
        with open(self.path, "rb") as handle:
            for number, raw in enumerate(handle, start=1):
                line = raw.rstrip(b"\r\n ")
                if dim is None:
                    first = line.split(b" ")
                    if len(first) == 2 and first[0].isdigit():
                        dim = int(first[1])
                        continue
                    dim = len(first) - 1
                word_end = line.find(b" ")
                try:
                    word = line[:word_end].decode("utf-8")
                except UnicodeDecodeError as error:
                    raise VectorFileError(f"{self.path}:{number}: the word is not UTF-8 ({error.reason})") from None
                if wanted is not None and word not in wanted:
                    continue
                values = line[word_end + 1 :].split(b" ")
                if word_end < 0 or len(values) != dim:
                    got = 0 if word_end < 0 else len(values)
                    raise VectorFileError(f"{self.path}:{number}: expected a word and {dim} numbers, got {got} numbers")
                try:
                    self._table[word] = np.array(values, dtype=np.float32)
                except ValueError:
                    raise VectorFileError(f"{self.path}:{number}: {word!r} has a value that is not a number") from None
            self.lines = number if dim is not None else 0
        if dim is None:
            raise VectorFileError(f"word-vector file {self.path} is empty")
        return dim

    def vector(self, word: str) -> np.ndarray | None:
        if self._model is not None:
            return self._model.get_word_vector(word)
        return self._table.get(word)

    def ngram_vector(self, ngram: str) -> np.ndarray | None:
        """A character n-gram's own row in a .bin's input matrix (what fastText averages
        into a word's vector); None for a .vec, which has no n-grams."""
        if self._model is None:
            return None
        return self._model.get_input_vector(self._model.get_subword_id(ngram))
