"""Word vectors: fastText trained on captions, or read from .vec files."""

import numpy as np
import pytest

from mule.data_catalog.vectors import VectorFile, VectorFileError
from mule.tasks.text import train_fasttext


def test_fasttext_learns_vectors_for_corpus_words_and_unseen_words():
    corpus = [["a", "red", "circle"], ["a", "blue", "square"], ["a", "red", "square"]] * 50
    model = train_fasttext(corpus, dim=8, model="skipgram", epochs=5, min_count=1, threads=1)
    assert model.get_word_vector("red").shape == (8,)
    assert np.abs(model.get_word_vector("circles")).sum() > 0  # built from subwords


def test_vec_file(tmp_path):
    path = tmp_path / "tiny.vec"
    path.write_text("2 3\nred 1 0 0\nblue 0 1 0.5\n", encoding="utf-8")
    vectors = VectorFile(path)
    assert vectors.dim == 3
    assert vectors.vector("blue").tolist() == [0.0, 1.0, 0.5]
    assert vectors.vector("green") is None


def test_bad_vec_file_names_the_line(tmp_path):
    path = tmp_path / "bad.vec"
    path.write_text("2 3\nred 1 0 0\nblue 0 1\n", encoding="utf-8")
    with pytest.raises(VectorFileError, match="bad.vec:3: expected a word and 3 numbers, got 2"):
        VectorFile(path)


def test_missing_vector_file(tmp_path):
    with pytest.raises(VectorFileError, match="does not exist"):
        VectorFile(tmp_path / "cc.en.300.bin")
