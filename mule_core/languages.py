"""Which tokeniser reads which language, decided by language code.

Space-delimited languages go through the Moses tokenizer (the one behind Multi30K's
tokenised files) and need its non-breaking-prefix list; Japanese and Chinese have no
spaces between words and are segmented by a dictionary-based tokeniser installed from
the registry with its dictionary: janome (IPADIC) for Japanese, jieba for Chinese.
Kept free of heavy imports: the config checks data.languages against it.
"""

from __future__ import annotations

# Languages with a Moses non-breaking-prefix list (sacremoses' data), minus the ones segmented below.
MOSES = ("as", "bn", "ca", "cs", "de", "el", "en", "es", "et", "fi", "fr", "ga", "gu", "hi", "hu", "is", "it",
         "kn", "lt", "lv", "ml", "mni", "mr", "nl", "or", "pa", "pl", "pt", "ro", "ru", "sk", "sl", "sv", "ta",
         "te")  # fmt: skip
SEGMENTED = {"ja": "janome", "zh": "jieba"}
SUPPORTED = tuple(sorted(MOSES + tuple(SEGMENTED)))


def tokenizer_name(lang: str) -> str:
    """'moses', 'janome' or 'jieba'; ValueError naming the supported codes otherwise."""
    if lang in SEGMENTED:
        return SEGMENTED[lang]
    if lang in MOSES:
        return "moses"
    raise ValueError(f"no tokeniser for language code {lang!r}; supported codes: {', '.join(SUPPORTED)}")
