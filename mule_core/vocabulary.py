"""Vocabularies, and sentences as rows of their word tables. Tokenisation is
mule_core/tokenizers.py's (its names are here too)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from itertools import chain

import numpy as np
import torch

from mule.mule_core.subwords import ngram_table
from mule.mule_core.tokenizers import normalise, tokenize, tokenizer_names, tokenizer_version  # noqa: F401 - text's names

PAD, UNK = "<pad>", "<unk>"


@dataclass
class Vocab:
    """Token <-> index for one language; index 0 pads, 1 is the unknown word."""

    tokens: list[str]

    def __post_init__(self) -> None:
        if self.tokens[:2] != [PAD, UNK]:
            raise ValueError("a vocabulary starts with <pad> and <unk>")
        self.index = {t: i for i, t in enumerate(self.tokens)}

    @classmethod
    def build(cls, tokenised: Iterable[Sequence[str]]) -> Vocab:
        seen: dict[str, None] = {}
        for tokens in tokenised:
            for t in tokens:
                seen.setdefault(t, None)
        return cls([PAD, UNK, *sorted(seen)])

    def __len__(self) -> int:
        return len(self.tokens)

    def encode(self, tokens: Sequence[str]) -> list[int]:
        return [self.index.get(t, 1) for t in tokens]

    def ngrams(self, lengths: Sequence[int]):
        """Its n-gram table (mule_core.subwords), held while the vocabulary lives."""
        table = self.__dict__.get("_ngrams")
        if table is None or table.lengths != tuple(lengths):
            table = self._ngrams = ngram_table(self.tokens, lengths)
        return table


@dataclass
class EncodedSentences:
    """Sentences of one language as rows of its word table (Vocabulary.encode)."""

    ids: list[list[int]]  # per sentence; from the vocabulary's size on, words outside it: rows of `unseen`
    unseen: torch.Tensor | None  # their character n-gram ids (mule_core.subwords), or None when there are none
    composed: list[list[str]]  # per sentence, its words outside the vocabulary built from their n-grams
    unknown: list[list[str]]  # per sentence, its words nothing is known of (<unk>)


@dataclass
class Vocabulary:
    """A model's languages, each one's vocabulary, and (from the word-vectors table) each
    one's initial word vectors and n-gram vectors; a vocabulary read from a model file has
    no vectors. `ngram_lengths`: the model's character n-grams (model.subwords), empty
    for one vector per word."""

    languages: list[str]
    vocabs: dict[str, Vocab]
    vectors: dict[str, torch.Tensor] | None = None
    ngram_vectors: dict[str, tuple[list[str], torch.Tensor]] | None = None  # lang -> (n-grams, vectors)
    ngram_lengths: tuple[int, ...] = ()

    @property
    def dim(self) -> int:
        return next(iter(self.vectors.values())).shape[1]

    @property
    def sizes(self) -> dict[str, int]:
        return {lang: len(v) for lang, v in self.vocabs.items()}

    @property
    def words(self) -> dict[str, list[str]]:
        """Each language's words in embedding-row order (what model.subwords builds on)."""
        return {lang: v.tokens for lang, v in self.vocabs.items()}

    def encode(self, lang: str, sentences: Sequence[Sequence[str]]) -> EncodedSentences:
        """The one way a tokenised sentence becomes word ids, for training, validation,
        evaluation, `mule search`, `mule serve` and the registered model alike: a word of
        the vocabulary is its row; a word outside it is composed from the character n-grams
        it shares with the vocabulary (with model.subwords), else it is <unk>."""
        vocab = self.vocabs[lang]
        table = vocab.ngrams(self.ngram_lengths) if self.ngram_lengths else None
        outside: dict[str, int] = {}  # word outside the vocabulary -> its id (from len(vocab) on)
        rows: list[list[int]] = []
        ids, composed, unknown = [], [], []
        known = vocab.index.get
        for tokens in sentences:
            found = list(map(known, tokens))  # every word a row of the table: one C loop (a training split's sentences)
            if None not in found and (not found or min(found) > 1):
                ids.append(found)
                composed.append([])
                unknown.append([])
                continue
            sentence, built, unknowns = [], [], []
            for token in tokens:
                index = vocab.index.get(token)
                if index is not None and index > 1:
                    sentence.append(index)
                    continue
                if token not in outside:
                    grams = table.word_ids(token) if table is not None else []
                    outside[token] = len(vocab) + len(rows) if grams else 1
                    if grams:
                        rows.append(grams)
                sentence.append(outside[token])
                (built if outside[token] > 1 else unknowns).append(token)
            ids.append(sentence)
            composed.append(built)
            unknown.append(unknowns)
        unseen = None
        if rows:
            unseen = torch.zeros(len(rows), max(map(len, rows)), dtype=torch.int32)
            for i, row in enumerate(rows):
                unseen[i, : len(row)] = torch.tensor(row, dtype=torch.int32)
        return EncodedSentences(ids, unseen, composed, unknown)


def pad_batch(sequences: Sequence[Sequence[int]], max_tokens: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded (N x T) int64 tokens and lengths; empty sequences become one <unk>."""
    if max_tokens < 1:
        raise ValueError(f"max_tokens must be 1 or more, not {max_tokens}")
    kept = [seq[:max_tokens] if len(seq) else (1,) for seq in sequences]
    lengths = np.fromiter(map(len, kept), dtype=np.int64, count=len(kept))
    out = np.zeros((len(kept), int(lengths.max(initial=1))), dtype=np.int64)
    flat = np.fromiter(chain.from_iterable(kept), dtype=np.int64, count=int(lengths.sum()))
    starts = np.repeat(np.cumsum(lengths) - lengths, lengths)
    out[np.repeat(np.arange(len(kept)), lengths), np.arange(len(flat)) - starts] = flat  # one scatter, not a row at a time
    return torch.from_numpy(out), torch.from_numpy(lengths)


def word_translator(pairs: Sequence[tuple[str, str]], target_counts: dict[str, int]) -> dict[str, str]:
    """Word -> translation from lexicon pairs; of several translations, the one most
    frequent in the target language's training captions."""
    best: dict[str, str] = {}
    for word, translation in pairs:
        current = best.get(word)
        if current is None or (target_counts.get(translation, 0), translation) > (
            target_counts.get(current, 0),
            current,
        ):
            best[word] = translation
    return best


def translate_tokens(tokens: Sequence[str], table: dict[str, str]) -> list[str]:
    """Word-by-word translation; words the lexicon lacks stay as they are."""
    return [table.get(token, token) for token in tokens]
