"""A sentence's language, among a model's own languages (a language it does not read is
never guessed).

Two readings, multiplied: a language identifier's probability (py3langid: langid.py's
naive Bayes over byte n-grams, 97 languages, its model inside a 4.6 MB wheel), restricted
to the model's languages, and the share of the sentence's words each language's
vocabulary knows (each language tokenising the sentence its own way). The identifier
tells English from a language whose vocabulary holds much English (an added language's
words come from wordfreq's web lists: 1,353 of English's 2,000 commonest words are in
Spanish's 50,000), the vocabulary tells a language from one it is spelled like when the
sentence is a word or two, and a language the identifier does not know (a code of the
user's own) is found by its words alone. On a tie, the language whose known words are more
frequent in its training captions (vocabularies are ordered by frequency) wins.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from mule.mule_core.languages import base
from mule.mule_core.tokenizers import tokenize
from mule.mule_core.vocabulary import Vocab

# The identifier's label for a language whose code it spells otherwise
IDENTIFIER_CODES = {"nb": "no", "fil": "tl"}
# Added to the identifier's probability: where it is sure a language is not the one
# (English words in a Czech model), the words still decide when nothing else knows them.
FLOOR = 0.01

_identifier = None
_loading = threading.Lock()


def identifier():
    """py3langid's identifier with normalised probabilities, loaded once a process (0.6 s).
    Never restricted in place (threads share it): `identified` renormalises over the
    languages asked for, which is the same as restricting it."""
    global _identifier
    with _loading:
        if _identifier is None:
            from py3langid.langid import MODEL_FILE, LanguageIdentifier

            _identifier = LanguageIdentifier.from_model_file(MODEL_FILE, norm_probs=True)
        return _identifier


def identified(text: str, languages: list[str]) -> dict[str, float]:
    """The identifier's probability of each of `languages` it knows (they sum to the share
    of the languages it knows; each other gets an even share), or {} when it knows none."""
    found = identifier()
    labels = {lang: IDENTIFIER_CODES.get(base(lang), base(lang)) for lang in languages}
    known = {lang: label for lang, label in labels.items() if label in found.labels}
    if not known:
        return {}
    scores = dict(found.rank(text))
    total = sum(scores[label] for label in set(known.values()))
    share = len(known) / len(languages)
    # two varieties of one language (pt-BR, pt-PT) share its probability: the words tell them apart
    varieties = {label: sum(1 for x in known.values() if x == label) for label in known.values()}
    out = {lang: share * scores[label] / max(total, 1e-30) / varieties[label] for lang, label in known.items()}
    return out | {lang: 1 / len(languages) for lang in languages if lang not in known}


@dataclass(frozen=True)
class LanguageGuess:
    lang: str | None  # None: no language knows any of the words
    known: dict[str, int]  # language -> words of the text in its vocabulary
    words: dict[str, int]  # language -> words of the text (each language tokenises its own way)
    identified: dict[str, float]  # language -> the identifier's probability ({}: it knows none of them)

    def describe(self) -> str:
        """The languages, most likely first: the identifier's probability and the words known."""
        order = sorted(self.known, key=lambda x: (-self.score(x), x))
        return ", ".join(f"{lang} {self.identified[lang]:.2f} x {self.known[lang]}/{self.words[lang]} words"
                         if self.identified else f"{lang} {self.known[lang]}/{self.words[lang]} words"
                         for lang in order)  # fmt: skip

    def score(self, lang: str) -> float:
        share = self.known[lang] / max(self.words[lang], 1)
        return share * (self.identified[lang] + FLOOR) if self.identified else share


def detect_language(text: str, vocabs: dict[str, Vocab], tokenizers: Mapping[str, str] | None = None,
                    use_identifier: bool = True) -> LanguageGuess:  # fmt: skip
    """The language of `text` among the vocabularies' languages (see the module's doc);
    use_identifier=False: the words alone."""
    known, words, rank = {}, {}, {}
    for lang, vocab in vocabs.items():
        tokens = tokenize(text, lang, tokenizers)
        indices = [vocab.index.get(t) for t in tokens]
        hits = [i for i in indices if i is not None and i > 1]
        known[lang], words[lang] = len(hits), len(tokens)
        rank[lang] = float(np.mean(np.log1p(hits))) if hits else float("inf")
    probabilities = identified(text, list(vocabs)) if use_identifier and any(known.values()) else {}
    guess = LanguageGuess(None, known, words, probabilities)
    best = max(vocabs, key=lambda x: (guess.score(x), known[x], -rank[x]), default=None)
    return LanguageGuess(best if best is not None and known[best] else None, known, words, probabilities)
