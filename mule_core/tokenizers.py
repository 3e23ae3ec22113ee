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

from mule.mule_core.languages import base, tokenizer_name

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


PACKAGES = {"moses": "sacremoses", "unicode": "regex", "janome": "janome", "jieba": "jieba"}  # what each rule runs
NORMALISATION = "lower-nfkc-1"  # normalise()'s rule: a new one is a new identity


@cache
def _installed(package: str) -> str:
    from importlib.metadata import version

    return version(package)


def tokenizer_version(lang: str, overrides: Mapping[str, str] | None = None) -> str:
    """What tokenises a language's captions, its identity: the rule, its library and that
    library's version, the normalisation ("moses sacremoses==0.1.1 lower-nfkc-1"). Stored
    with the captions at ingest (part of ingest's key) and with every model trained on
    them; serving compares it with what is installed (drift)."""
    name = tokenizer_name(lang, overrides)
    return f"{name} {PACKAGES[name]}=={_installed(PACKAGES[name])} {NORMALISATION}"


def tokenizer_names(identities: Mapping[str, str]) -> dict[str, str]:
    """lang -> the rule's name of each identity (also of those stored before libraries were
    named: "moses-lower-nfkc-1", "janome-0.5.0-lower-nfkc-1")."""
    return {lang: re.match(r"[a-z]+", identity)[0] for lang, identity in identities.items()}


def drift(identities: Mapping[str, str]) -> dict[str, tuple[str, str]]:
    """lang -> (the identity stored, the identity installed now) where the two differ: the
    same rule run by another version of its library (or another normalisation) may split
    a sentence otherwise than the training captions were split."""
    names = tokenizer_names(identities)
    now = {lang: tokenizer_version(lang, names) for lang in identities}
    return {lang: (identities[lang], now[lang]) for lang in identities if identities[lang] != now[lang]}


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
