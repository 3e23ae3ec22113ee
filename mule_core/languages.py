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

import re
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


# "Portuguese (Brazil)", "Serbian (Latin)", "Chinese (Simplified)": CLDR's display names
_QUALIFIED = re.compile(r"^\s*(?P<name>[^()]+?)\s*\((?P<qualifiers>[^()]+)\)\s*$")


def language_named(name: str) -> str | None:
    """The code of a language written by its name, in English or in the language itself
    ("English" -> "en", "Deutsch" -> "de", "русский" -> "ru"), from CLDR's names
    (langcodes' data), its script or region kept when the name gives one in brackets, as
    CLDR writes them ("Portuguese (Brazil)" -> "pt-BR", "Serbian (Latin)" -> "sr-Latn",
    "Chinese (Simplified)" -> "zh-Hans"); None when no language has that name."""
    import langcodes

    text = str(name).strip()
    if not text:
        return None
    match = _QUALIFIED.match(text)
    if match:
        found = _qualified(langcodes, match["name"], match["qualifiers"])
        if found:
            return found
    try:
        return langcodes.find(text).to_tag()
    except LookupError:
        return None


def _qualified(langcodes, name: str, qualifiers: str) -> str | None:
    """A language's name with its script and region in brackets, as one tag; None when a
    part names no language, script or region."""
    try:
        language = langcodes.find(name.strip())
    except LookupError:
        return None
    parts = {"language": language.language, "script": language.script, "territory": language.territory}
    for qualifier in (q.strip() for q in qualifiers.split(",")):
        for kind in ("script", "territory"):
            try:
                parts[kind] = getattr(langcodes.Language.find_name(kind, qualifier), kind)
                break
            except LookupError:
                continue
        else:
            return None
    return langcodes.standardize_tag(langcodes.Language.make(**parts).to_tag())


def variety_of(code: str, wanted) -> tuple[str | None, str]:
    """(the language among `wanted` that `code` is a variety of when `code` itself is not
    there, or None; why not, for people): en-US -> en, zh-Hans-CN -> zh-Hans or zh
    (subtags dropped from the right). A variety in another script is another language
    here: zh-Hant is not zh (written in Simplified Han), sr-Latn is not sr (Cyrillic)."""
    parts = code.split("-")
    for end in range(len(parts) - 1, 0, -1):
        shorter = "-".join(parts[:end])
        if shorter in wanted:
            mine, theirs = _script(code), _script(shorter)
            if mine != theirs:
                return None, f"{shorter} is written in another script ({theirs}, {code} in {mine})"
            return shorter, ""
    return None, ""


def _script(code: str) -> str:
    import langcodes

    return langcodes.get(code).maximize().script or ""


def read_language(value, known=None) -> tuple[str, str]:
    """The one reading of a language, wherever one is given (a caption table's lang column,
    data.languages, `mule embed`, `mule search --lang`, mule.api, `mule serve`): a BCP 47 tag
    in any case or with underscores (EN, pt_br), or a language's name (English, Deutsch,
    "Portuguese (Brazil)"). With `known` (the languages a model or a run reads), a variety
    of one of them in the same script is read as it (en-US as en; zh-Hant is never zh).

    Returns (the code, how it was read: "" as written, else what was done), or raises
    LanguageCodeError saying what is wrong."""
    if not isinstance(value, str):
        what = "a number" if isinstance(value, int | float) and not isinstance(value, bool) else type(value).__name__
        raise LanguageCodeError(f"{value!r} is {what}, not a language code (a BCP 47 tag such as es, pl or pt-BR, "
                                "or a language's name)")  # fmt: skip
    how = ""
    try:
        code = language_code(value)
    except LanguageCodeError as error:
        code, how = language_named(value), "its name"
        if code is None:
            raise LanguageCodeError(f"{error.args[0]}, nor a language's name") from None
    if known is None or code in known:
        return code, how
    shorter, why = variety_of(code, known)
    if shorter is None:
        named = f" ({value!r} read as {code})" if how else ""
        raise LanguageCodeError(f"{code}{named} is none of the languages here: {', '.join(known)}"
                                + (f"; {why}" if why else ""))  # fmt: skip
    return shorter, f"{how} and " * bool(how) + f"{shorter} without {code}'s subtags"


def language_pair(value: str, known=()) -> tuple[str, str]:
    """A translation pair, "src-dest" (en-de, en-pt-BR, zh-Hant-en; or src:dest), as two
    codes read as language_code reads them; where the dashes allow two readings (en-pt-BR:
    en -> pt-BR, or en-PT -> br, Breton), the one whose languages are `known`, else
    LanguageCodeError asking for src:dest. Refused: a side that is no language (en-xx), a
    pair of one language."""
    text = str(value).strip()
    splits = [tuple(text.split(":", 1))] if ":" in text else [(text[:i], text[i + 1 :]) for i, c in enumerate(text)
                                                               if c == "-"]  # fmt: skip
    readings = []
    for source, target in splits:
        try:
            readings.append((language_code(source.replace("_", "-")), language_code(target.replace("_", "-"))))
        except LanguageCodeError:
            continue
    readings = list(dict.fromkeys(readings))
    if len(readings) > 1 and known:
        readings = [r for r in readings if set(r) <= set(known)] or readings
    if not readings:
        raise LanguageCodeError(f"{value!r} is not 'src-dest' of two language codes (e.g. en-de, en-pt-BR)")
    if len(readings) > 1:
        said = " or ".join(f"{a} -> {b}" for a, b in readings)
        raise LanguageCodeError(f"{value!r} reads as {said}: write it src:dest (e.g. {readings[0][0]}:{readings[0][1]})")
    source, target = readings[0]
    if source == target:
        raise LanguageCodeError(f"{value!r} translates {source} into itself")
    return source, target


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
