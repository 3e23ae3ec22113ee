"""Word vectors that share what words share: a word's vector is its own vector plus the
mean of its character n-grams' vectors, and all of them are fine-tuned. A word outside
the vocabulary (a test caption's, a user's query's) is the mean of its n-grams' vectors
alone: fastText's composition of an unseen word (Bojanowski et al. 2017), with what
training taught the n-grams.

A word fine-tuned on its own moves only when it occurs. Czech and French have one caption
per Multi30K training image, and Czech spells each noun six or seven ways: 4.0% of its
test tokens never occur in the training captions and 7.4% occur at most twice. Through
shared n-grams, what training teaches "psem" reaches "psa" and "psovi" too, and a form
training never saw is built from the same n-grams.

Only n-grams that at least two vocabulary words share get a vector: an n-gram of one word
alone holds nothing that the word's own vector cannot (and it halves the table).

The n-gram vectors start from the word-vector model's own (fastText's input rows for the
n-gram), and each word's own vector starts at what makes the composition exactly the
vector it was given; where the word vectors came without n-grams (multilingual-e5, a .vec
file) the n-grams start at zero. Either way a model starts from exactly the word vectors
it was given.
"""

from __future__ import annotations

import collections
import itertools
import threading
import weakref
from collections import Counter
from collections.abc import Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from mule.mule_core import collector

# Vocabulary words that must contain an n-gram for it to get a vector of its own.
MIN_WORDS = 2
SPECIALS = 2  # <pad> and <unk> have no n-grams


def char_ngrams(word: str, lengths: Sequence[int]) -> set[str]:
    """fastText's n-grams: the substrings of the given lengths of the word wrapped in < and
    >, except the wrapped word itself ("dog", 3 -> <do, dog, og>)."""
    wrapped = f"<{word}>"
    return {wrapped[i : i + n] for n in lengths for i in range(len(wrapped) - n + 1)} - {wrapped}


class NgramTable:
    """The character n-grams that MIN_WORDS or more words of a vocabulary share, with ids
    from 1 (0 pads) in a fixed order: the same words give the same table.

    `index`: row i holds word i's n-gram ids (a words x widest-row int32 table; the first
    SPECIALS words have none). `rows(words)`: the same for any words, those outside the
    vocabulary included (their n-grams that the vocabulary shares)."""

    def __init__(self, words: Sequence[str], lengths: Sequence[int]):
        self.lengths = tuple(lengths)
        grams = [set() if i < SPECIALS else char_ngrams(w, self.lengths) for i, w in enumerate(words)]
        shared = Counter(g for word_grams in grams for g in word_grams)
        self.ids: dict[str, int] = {}
        rows = []
        for word_grams in grams:
            kept = sorted(g for g in word_grams if shared[g] >= MIN_WORDS)
            rows.append([self.ids.setdefault(g, len(self.ids) + 1) for g in kept])
        self.index = _table(rows)

    def __len__(self) -> int:
        return len(self.ids)

    @property
    def ngrams(self) -> list[str]:
        """The n-grams in id order (id 1 first)."""
        return list(self.ids)

    def word_ids(self, word: str) -> list[int]:
        return sorted(self.ids[g] for g in char_ngrams(word, self.lengths) if g in self.ids)

    def rows(self, words: Sequence[str]) -> torch.Tensor:
        return _table([self.word_ids(w) for w in words])


def _table(rows: list[list[int]]) -> torch.Tensor:
    """Rows of ids, left-aligned in a zero-padded table: one scatter (a tensor per row was
    a second of the real text's German vocabulary)."""
    lengths = np.fromiter((len(r) for r in rows), dtype=np.int64, count=len(rows))
    table = np.zeros((len(rows), int(lengths.max(initial=0)) or 1), dtype=np.int32)
    flat = np.fromiter(itertools.chain.from_iterable(rows), dtype=np.int32, count=int(lengths.sum()))
    starts = np.repeat(np.cumsum(lengths) - lengths, lengths)
    table[np.repeat(np.arange(len(rows)), lengths), np.arange(len(flat)) - starts] = flat
    return torch.from_numpy(table)


# Every table in use, by vocabulary: as many as there are languages in use, each kept while
# a model's layers or a Vocab hold it (a fixed-size LRU of 16 rebuilt every table, on every
# query, past 16 languages; an unbounded one would keep every reloaded model's tables).
_TABLES: weakref.WeakValueDictionary = weakref.WeakValueDictionary()
_TABLES_LOCK = threading.Lock()
# ... and the last few built, in use or not: a run's stages (text, LP, training, evaluation)
# read the same vocabularies one after the other, each table 1-3 s to build on the real text
_RECENT: collections.deque = collections.deque(maxlen=8)


def ngram_table(words: Sequence[str], lengths: Sequence[int]) -> NgramTable:
    """NgramTable(words, lengths), built once per vocabulary while it is in use: the model's
    layers and the sentence encoding that feeds them (mule_core.vocabulary.Vocabulary) read the
    same table."""
    key = (tuple(words), tuple(lengths))
    with _TABLES_LOCK:
        table = _TABLES.get(key)
        if table is None:
            with collector.paused():  # a vocabulary's n-grams: millions of small objects
                table = _TABLES[key] = NgramTable(*key)
            _RECENT.append(table)
    return table


def ngram_index(words: Sequence[str], lengths: Sequence[int]) -> tuple[torch.Tensor, int]:
    """(NgramTable.index, how many n-grams)."""
    table = ngram_table(words, lengths)
    return table.index, len(table)


def gather_rows(rows: torch.Tensor, inverse: torch.Tensor, shape: torch.Size) -> torch.Tensor:
    """rows[inverse], shaped `shape` + the rows' width. index_select, not rows[inverse]:
    advanced indexing's gradient (an accumulating index_put) sums in a different order from
    run to run on several CPU threads, and a resumed run must be the run never stopped, to the bit."""
    return rows.index_select(0, inverse.reshape(-1)).reshape(*shape, -1)


class SubwordVectors(nn.Module):
    """The n-gram half of a language's word vectors; `compose` adds it to the words' own."""

    def __init__(self, words: Sequence[str], dim: int, lengths: Sequence[int]):
        super().__init__()
        self.table = ngram_table(words, lengths)
        index = self.table.index
        # Rebuilt from the vocabulary (saved with every model), not saved: it is a function of it.
        self.register_buffer("index", index, persistent=False)
        self.register_buffer("count", (index > 0).sum(1).clamp(min=1).float(), persistent=False)
        self.vectors = nn.EmbeddingBag(len(self.table) + 1, dim, mode="sum", padding_idx=0)
        nn.init.zeros_(self.vectors.weight)

    def mean(self, rows: torch.Tensor) -> torch.Tensor:
        """The mean of the n-gram vectors of each row of n-gram ids (0 where a row has none)."""
        count = (rows > 0).sum(1).clamp(min=1).to(self.vectors.weight.dtype)
        return self.sums(rows) / count[:, None]

    def sums(self, rows: torch.Tensor) -> torch.Tensor:
        """The sum of the n-gram vectors of each row of n-gram ids. With sparse gradients
        (train.word_updates=rows), each distinct n-gram is read once and the rows summed from
        those: the table's gradient is one row per n-gram the batch read, where the bag's
        own has one per (word, n-gram) (15 times as many on the real text). The same sums."""
        if not self.vectors.sparse:
            return self.vectors(rows.long())
        grams, slot = rows.long().unique(return_inverse=True)
        vectors = F.embedding(grams, self.vectors.weight, padding_idx=0, sparse=True)
        return F.embedding_bag(slot, vectors, mode="sum", padding_idx=0 if int(grams[0]) == 0 else None)

    def compose(self, embed: nn.Embedding, tokens: torch.Tensor, unseen: torch.Tensor | None = None) -> torch.Tensor:
        """Word vectors of `tokens` (any shape): own vector + mean of the n-grams' vectors.
        Ids from the vocabulary's size on are words outside it: row (id - size) of
        `unseen` holds their n-gram ids, and they are the mean of those alone."""
        unique, inverse = tokens.unique(return_inverse=True)
        return gather_rows(self.compose_distinct(embed, unique, unseen), inverse, tokens.shape)

    def compose_distinct(self, embed: nn.Embedding, unique: torch.Tensor, unseen: torch.Tensor | None = None) -> torch.Tensor:
        """`compose` of sorted distinct ids (a batch repeats its words many times: each is composed once)."""
        size = embed.num_embeddings
        if unseen is None or int(unique[-1]) < size:
            ngrams = self.sums(self.index[unique]) / self.count[unique, None].to(embed.weight.dtype)
            return embed(unique) + ngrams
        known = unique < size
        return torch.cat([embed(unique[known]) + self.mean(self.index[unique[known]]),
                          self.mean(unseen.to(unique.device)[unique[~known] - size])])  # fmt: skip

    def set_initial(self, ngrams: Sequence[str], vectors: torch.Tensor) -> None:
        """N-gram vectors from the word-vector model (row i of `vectors` is ngrams[i]'s); the
        table's other n-grams start at zero."""
        rows = [(i, self.table.ids[g]) for i, g in enumerate(ngrams) if g in self.table.ids]
        with torch.no_grad():
            self.vectors.weight.zero_()
            if rows:
                given, mine = (torch.tensor(r, dtype=torch.long) for r in zip(*rows))
                self.vectors.weight[mine] = vectors[given].to(self.vectors.weight.dtype)
