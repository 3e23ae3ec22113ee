"""Tokenisation and vocabularies."""

import torch

from mule_core.text import PAD, UNK, Vocab, pad_batch, tokenize


def test_moses_tokenisation_lower_cases_and_splits_punctuation():
    assert tokenize("A dog, running.", "en") == ["a", "dog", ",", "running", "."]
    assert tokenize("Zwei Männer\u200b reden.", "de") == ["zwei", "männer", "reden", "."]  # zero-width space dropped
    assert tokenize("L'homme court.", "fr") == ["l'", "homme", "court", "."]


def test_vocab_reserves_pad_and_unknown():
    vocab = Vocab.build([["b", "a"], ["a", "c"]])
    assert vocab.tokens == [PAD, UNK, "a", "b", "c"]
    assert vocab.encode(["c", "zzz", "a"]) == [4, 1, 2]


def test_pad_batch_pads_truncates_and_never_yields_empty_rows():
    tokens, lengths = pad_batch([[5, 6, 7], [8], []], max_tokens=2)
    assert tokens.tolist() == [[5, 6], [8, 0], [1, 0]]
    assert lengths.tolist() == [2, 1, 1]
    assert tokens.dtype == torch.int64
