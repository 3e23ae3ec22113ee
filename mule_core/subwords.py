"""Word vectors that share what words share: a word's vector is its own vector plus the
mean of its character n-grams' vectors (fastText's composition, Bojanowski et al. 2017),
and all of them are fine-tuned.

A word fine-tuned on its own moves only when it occurs. Czech and French have one caption
per Multi30K training image, and Czech spells each noun six or seven ways: 4.0% of its
test tokens never occur in the training captions and 7.4% occur at most twice, so their
vectors stay where fastText left them while the words around them move. Through shared
n-grams, what training teaches "psem" reaches "psa" and "psovi" too.

Only n-grams that at least two words of the vocabulary share get a vector: an n-gram of
one word alone holds nothing that the word's own vector cannot (and it halves the table).
The n-gram vectors start at zero, so a model starts from exactly the word vectors it was
given (fastText's, e5's or a file's).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

import torch
from torch import nn

# Vocabulary words that must contain an n-gram for it to get a vector of its own.
MIN_WORDS = 2


def char_ngrams(word: str, lengths: Sequence[int]) -> set[str]:
    """fastText's n-grams: the substrings of the given lengths of the word wrapped in < and
    >, except the wrapped word itself ("dog", 3 -> <do, dog, og>)."""
    wrapped = f"<{word}>"
    return {wrapped[i : i + n] for n in lengths for i in range(len(wrapped) - n + 1)} - {wrapped}


def ngram_index(words: Sequence[str], lengths: Sequence[int], specials: int = 2) -> tuple[torch.Tensor, int]:
    """Row i: the ids (from 1; 0 pads) of word i's n-grams that MIN_WORDS or more words
    share, in a words x widest-row int32 table, and how many n-grams there are. The first
    `specials` words (<pad>, <unk>) have none. Ids follow the vocabulary's order: the same
    words give the same table."""
    grams = [set() if i < specials else char_ngrams(w, lengths) for i, w in enumerate(words)]
    shared = Counter(g for word_grams in grams for g in word_grams)
    ids: dict[str, int] = {}
    rows = []
    for word_grams in grams:
        kept = sorted(g for g in word_grams if shared[g] >= MIN_WORDS)
        rows.append([ids.setdefault(g, len(ids) + 1) for g in kept])
    table = torch.zeros(len(words), max((len(r) for r in rows), default=0) or 1, dtype=torch.int32)
    for i, row in enumerate(rows):
        table[i, : len(row)] = torch.tensor(row, dtype=torch.int32)
    return table, len(ids)


class SubwordVectors(nn.Module):
    """The n-gram half of a language's word vectors; `compose` adds it to the words' own."""

    def __init__(self, words: Sequence[str], dim: int, lengths: Sequence[int]):
        super().__init__()
        index, count = ngram_index(words, lengths)
        # Rebuilt from the vocabulary (saved with every model), not saved: it is a function of it.
        self.register_buffer("index", index, persistent=False)
        self.register_buffer("count", (index > 0).sum(1).clamp(min=1).float(), persistent=False)
        self.vectors = nn.EmbeddingBag(count + 1, dim, mode="sum", padding_idx=0)
        nn.init.zeros_(self.vectors.weight)

    def compose(self, embed: nn.Embedding, tokens: torch.Tensor) -> torch.Tensor:
        """Word vectors of `tokens` (any shape): own vector + mean of the n-grams' vectors.
        Each distinct word is composed once per call (a batch repeats its words many times)."""
        unique, inverse = tokens.unique(return_inverse=True)
        ngrams = self.vectors(self.index[unique].long()) / self.count[unique, None].to(embed.weight.dtype)
        composed = embed(unique) + ngrams
        # index_select, not composed[inverse]: advanced indexing's gradient (an accumulating
        # index_put) sums in a different order from run to run on several CPU threads, and a
        # resumed run must be the run never stopped, to the bit.
        return composed.index_select(0, inverse.reshape(-1)).reshape(*tokens.shape, -1)
