"""Tokenisation: a caption -> its words, by its language's tokeniser.

Every caption is lower-cased and NFKC-normalised (which also folds full-width Latin
letters and digits in Japanese and Chinese text), then split into words by its
language's tokeniser (mule_core/languages.py): Moses (sacremoses, the tokenizer behind
Multi30K's official tokenised files) for the languages it knows, janome for Japanese,
jieba for Chinese, Unicode's word boundaries (UAX #29) for every other language.
Without torch: processes that only tokenise (the ingest stage's pool) start in a fraction
of a second.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Mapping, Sequence
from functools import cache

from .languages import base, tokenizer_name

TOKENIZER_VERSION = "moses-lower-nfkc-1"  # space-delimited languages (stored with each ingest)
_INVISIBLE = re.compile("[\u200b\u200c\u200d\u2060\ufeff]")


@cache
def _moses(lang: str):
    from sacremoses import MosesTokenizer

    return MosesTokenizer(lang=lang)


def normalise(text: str) -> str:
    text = unicodedata.normalize("NFKC", text)
    return _INVISIBLE.sub("", text).strip().lower()


@cache
def _janome():
    from janome.tokenizer import Tokenizer

    return Tokenizer(wakati=True)


@cache
def _jieba():
    import logging

    import jieba

    jieba.setLogLevel(logging.WARNING)  # it logs its dictionary loading at INFO
    jieba.initialize()
    return jieba


@cache
def _word_boundaries():
    import regex

    return regex.compile(r"(?V1w)\b")


def tokenizer_version(lang: str, overrides: Mapping[str, str] | None = None) -> str:
    """What tokenised a language's captions: stored with the ingest, part of the stage keys."""
    name = tokenizer_name(lang, overrides)
    if name == "moses":
        return TOKENIZER_VERSION
    from importlib.metadata import version

    package = "regex" if name == "unicode" else name
    return f"{name}-{version(package)}-lower-nfkc-1"


def tokenize(text: str, lang: str, overrides: Mapping[str, str] | None = None) -> list[str]:
    """The words of `text` in `lang`, by its tokeniser (mule_core.languages: the rule, or
    `overrides`, the model's text.tokenizers)."""
    name = tokenizer_name(lang, overrides)
    text = normalise(text)
    if name == "moses":
        return _moses(base(lang)).tokenize(text, escape=False)
    if name == "unicode":
        words = _word_boundaries().split(text)
    else:
        words = _janome().tokenize(text) if name == "janome" else _jieba().cut(text)
    return [w for w in (w.strip() for w in words) if w]


def tokenize_all(pairs: Sequence[tuple[str, str]], overrides: Mapping[str, str] | None = None) -> list[list[str]]:
    """tokenize over (text, lang) pairs: one call per chunk of a process pool."""
    return [tokenize(text, lang, overrides) for text, lang in pairs]
