"""Word-by-word machine translation without a network: a bilingual word table, from a
lexicon (MUSE format, shipped with the embedded dataset) or learned from parallel
sentences with IBM Model 1 (the lexical model behind fast_align), which Multi30K's task1
lines are (every caption has its German, French and Czech translation).

Pure functions on token lists; the translate stage brings the sentences and stores the
results.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from mule.words.arithmetic import nearest
from mule.words.common import centre_words, centred, of_the_language
from mule.words.vectors import word_vectors

NULL = "<null>"  # the empty source word: target words that translate nothing align to it


@dataclass(frozen=True)
class WordTable:
    """source word -> target word; words without an entry stay as they are (and are counted)."""

    entries: dict[str, str]

    def translate(self, tokens: Sequence[str]) -> tuple[list[str], int]:
        """(translated tokens, how many had no entry)."""
        out, missing = [], 0
        for token in tokens:
            target = self.entries.get(token)
            if target is None:
                missing += 1
                out.append(token)
            elif target != NULL:
                out.append(target)
        return out, missing


def ibm_model1(
    pairs: Sequence[tuple[Sequence[str], Sequence[str]]], iterations: int = 5
) -> dict[tuple[str, str], float]:
    """t(target | source) by EM over sentence pairs (source tokens, target tokens), a NULL
    source word in every sentence. Vectorised over all (source, target) co-occurrences:
    one bincount per step instead of a Python loop over words."""
    src_vocab: dict[str, int] = {NULL: 0}
    tgt_vocab: dict[str, int] = {}
    sentence, e_ids, f_ids, f_slot = [], [], [], []
    slot = 0
    for index, (source, target) in enumerate(pairs):
        if not target:
            continue
        e = [0] + [src_vocab.setdefault(w, len(src_vocab)) for w in source]
        for word in target:
            f = tgt_vocab.setdefault(word, len(tgt_vocab))
            e_ids.extend(e)
            f_ids.extend([f] * len(e))
            f_slot.extend([slot] * len(e))  # one slot per target word: its alignment sums to one
            slot += 1
        sentence.append(index)
    if not e_ids:
        return {}
    e_arr, f_arr, slots = np.asarray(e_ids), np.asarray(f_ids), np.asarray(f_slot)
    keys, pair_of = np.unique(e_arr * len(tgt_vocab) + f_arr, return_inverse=True)
    pair_e = keys // len(tgt_vocab)
    t = np.full(len(keys), 1.0 / len(tgt_vocab))  # uniform start
    for _ in range(iterations):
        p = t[pair_of]
        posterior = p / np.bincount(slots, weights=p)[slots]
        count = np.bincount(pair_of, weights=posterior, minlength=len(keys))
        t = count / np.bincount(pair_e, weights=count, minlength=len(src_vocab))[pair_e]
    src_words, tgt_words = list(src_vocab), list(tgt_vocab)
    return {(src_words[k // len(tgt_vocab)], tgt_words[k % len(tgt_vocab)]): float(p) for k, p in zip(keys, t)}


def best_translations(table: dict[tuple[str, str], float], min_probability: float = 0.1) -> WordTable:
    """Each source word's most probable target word (ties: the alphabetically first), if at
    least min_probability; rarer alignments are noise, and the word is better kept as it is."""
    best: dict[str, tuple[float, str]] = {}
    for (source, target), p in sorted(table.items()):
        if source != NULL and (source not in best or p > best[source][0]):
            best[source] = (p, target)
    return WordTable({s: t for s, (p, t) in best.items() if p >= min_probability})


def word_table(words: list[str], lang: str, into: str, candidates: list[str],
               tokenizers: dict[str, str] | None = None) -> dict[str, str]:  # fmt: skip
    """A word table from `lang` into `into`: each of `words` to its nearest of `candidates`
    by multilingual-e5 (each language centred on its commonest words, as the aligned start
    reads them); what translation by nearest word is, for any two languages e5 reads."""
    centres = {x: centre_words(x, tokenizers) for x in (lang, into)}
    candidates = of_the_language(candidates, into, lang)
    every = list(dict.fromkeys([*words, *candidates, *centres[lang], *centres[into]]))
    read = dict(zip(every, word_vectors(every, f"e5 words ({lang}, {into})", logger=logging.getLogger("mule.words"))))

    def rows(ws: list[str]) -> np.ndarray:
        return np.stack([read[w] for w in ws]) if ws else None

    index, _ = nearest(centred(rows(words), rows(centres[lang])), centred(rows(candidates), rows(centres[into])))
    return {word: candidates[i] for word, i in zip(words, index)}
