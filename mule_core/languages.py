"""Which tokeniser reads which language, decided by language code.

The rule: Japanese and Chinese have no spaces between words and are segmented by a
dictionary-based tokeniser installed from the registry with its dictionary: janome
(IPADIC) for Japanese, jieba for Chinese. Languages with a Moses non-breaking-prefix list
(sacremoses' data) go through the Moses tokenizer, the one behind Multi30K's tokenised
files. Every other language gets Unicode's word boundaries (UAX #29, the `regex`
module's `(?w)` rule): words and punctuation for any script that separates words,
one grapheme at a time for those that do not and have no dictionary here (Thai, Lao,
Khmer, Myanmar). `text.tokenizers` overrides the rule per language
(`--set text.tokenizers=th=unicode,sw=moses`).

A language code is a BCP 47 tag in IANA's registry (es, pl, pt-BR, zh-Hant; checked by
the langcodes package): "spanish" or "xx" is refused by name. Kept free of heavy
imports: the config checks data.languages against it.
"""

from __future__ import annotations

from collections.abc import Mapping

# Languages with a Moses non-breaking-prefix list (sacremoses' data), minus the ones segmented below.
MOSES = ("as", "bn", "ca", "cs", "de", "el", "en", "es", "et", "fi", "fr", "ga", "gu", "hi", "hu", "is", "it",
         "kn", "lt", "lv", "ml", "mni", "mr", "nl", "or", "pa", "pl", "pt", "ro", "ru", "sk", "sl", "sv", "ta",
         "te")  # fmt: skip
SEGMENTED = {"ja": "janome", "zh": "jieba"}
TOKENIZERS = ("moses", "janome", "jieba", "unicode")


class LanguageCodeError(ValueError):
    pass


# Tags already in standard form that mule's own tokeniser rules name (tests/test_text.py
# checks each against langcodes): every config names some, and langcodes' import and
# registry are a tenth of a no-change rebuild.
STANDARD = frozenset(MOSES) | frozenset(SEGMENTED)


def language_code(value: str) -> str:
    """`value` as a standard BCP 47 tag ("EN" -> "en", "pt_br" -> "pt-BR"), or
    LanguageCodeError naming what is wrong."""
    if isinstance(value, str) and value in STANDARD:
        return value
    import langcodes

    text = str(value).strip().replace("_", "-")
    if not text or not langcodes.tag_is_valid(text):
        raise LanguageCodeError(f"{value!r} is not a language code (a BCP 47 tag such as es, pl, pt-BR or th)")
    return langcodes.standardize_tag(text)


def language_named(name: str) -> str | None:
    """The code of a language written by its name, in English or in the language itself
    ("English" -> "en", "Deutsch" -> "de", "русский" -> "ru"), from CLDR's names
    (langcodes' data); None when no language has that name."""
    import langcodes

    try:
        return langcodes.find(str(name).strip()).to_tag() if str(name).strip() else None
    except LookupError:
        return None


def within(code: str, wanted) -> str | None:
    """The language among `wanted` that `code` is a variety of, when `code` itself is not
    there: en-US -> en, zh-Hant-TW -> zh-Hant or zh (subtags dropped from the right)."""
    parts = code.split("-")
    for end in range(len(parts) - 1, 0, -1):
        shorter = "-".join(parts[:end])
        if shorter in wanted:
            return shorter
    return None


def base(lang: str) -> str:
    """The language subtag: pt-BR -> pt, zh-Hant -> zh."""
    return lang.split("-", 1)[0].lower()


def tokenizer_name(lang: str, overrides: Mapping[str, str] | None = None) -> str:
    """'moses', 'janome', 'jieba' or 'unicode': the override for `lang` when there is one,
    else the rule above."""
    if overrides and lang in overrides:
        name = overrides[lang]
        if name not in TOKENIZERS:
            raise ValueError(f"text.tokenizers: {lang}={name!r} is not a tokeniser; choose one of {', '.join(TOKENIZERS)}")
        return name
    code = base(lang)
    if code in SEGMENTED:
        return SEGMENTED[code]
    if code in MOSES:
        return "moses"
    return "unicode"
