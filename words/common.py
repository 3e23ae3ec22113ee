"""A language's words as e5 reads them: its commonest (wordfreq's lists, inside the wheel:
no download), its centre in e5's space, and which words of a web list are another
language's borrowings.

e5's vectors of one language share a large part that says only which language it is (any
two words score about 0.85): before words of two languages are compared, each is centred,
always the same way (`centred`): on the mean of its language's commonest words, so that
centres are comparable across languages, or, for a language wordfreq does not list, on
the words' own mean.
"""

from __future__ import annotations

import numpy as np

from mule.mule_core.errors import UserError
from mule.mule_core.tokenizers import tokenize
from mule.mule_core.vocabulary import PAD, UNK

MEAN_WORDS = 1000  # a language's commonest words: its centre in e5's space (comparable across languages)


class OpenWordsMissing(UserError, RuntimeError):
    pass


def common_words(lang: str, count: int, tokenizers: dict[str, str] | None = None) -> list[str]:
    """The `count` commonest words of `lang` (wordfreq's list, read from the wheel: no
    download), each as mule's tokeniser reads it: a word it splits in two is left out, so
    every row is a word a caption can hold. [] for a language wordfreq does not list."""
    if count <= 0:
        return []
    try:
        import wordfreq
    except ImportError:
        raise OpenWordsMissing("wordfreq is not installed: pip install wordfreq (a language's common words, "
                               "offline)") from None  # fmt: skip
    from mule.mule_core.languages import base

    if base(lang) not in wordfreq.available_languages():
        return []
    words = []
    for word in wordfreq.top_n_list(base(lang), count):
        tokens = tokenize(word, lang, tokenizers)
        if len(tokens) == 1 and tokens[0] not in (PAD, UNK):
            words.append(tokens[0])
    return list(dict.fromkeys(words))


def centre_words(lang: str, tokenizers: dict[str, str] | None = None) -> list[str]:
    """The words a language's centre is the mean of: its MEAN_WORDS commonest ([] where
    wordfreq lists none: then the words centred are their own centre)."""
    return common_words(lang, MEAN_WORDS, tokenizers)


def centred(rows: np.ndarray, centre_rows: np.ndarray | None) -> np.ndarray:
    """Rows of one language's e5 vectors minus its centre: the mean of its commonest words'
    rows (`centre_rows`), or, without them, of the rows themselves."""
    centre = centre_rows if centre_rows is not None and len(centre_rows) else rows
    return rows - centre.mean(0, keepdims=True)


def of_the_language(candidates: list[str], lang: str, other: str) -> list[str]:
    """The candidates that are `lang`'s words rather than `other`'s: wordfreq's lists are read
    off the web, where a Spanish page quotes English ("man", "dog"), so a word more frequent
    in `other` than in `lang` is a borrowing, not a translation (a translation by nearest
    word would otherwise keep every word as it is)."""
    import wordfreq

    from mule.mule_core.languages import base

    mine, theirs = (wordfreq.get_frequency_dict(base(x)) if base(x) in wordfreq.available_languages() else {}
                    for x in (lang, other))  # fmt: skip
    return [w for w in candidates if mine.get(w, 0.0) >= theirs.get(w, 0.0)]
