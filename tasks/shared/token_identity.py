"""One tokeniser from ingest to serving: the stages that use the captions' tokens check
that text.tokenizers still names the tokenisers that made them, and hand their identities
on (a model carries them; serving tokenises a query by them and says when the installed
library differs)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from mule.data_catalog.tables import Catalog
from mule.mule_core.errors import UserError
from mule.mule_core.languages import tokenizer_name
from mule.mule_core.tokenizers import tokenizer_names, tokenizer_version


class TokenizerChangedError(UserError, RuntimeError):
    pass


def changed(catalog: Catalog, dataset: str, languages: Iterable[str], overrides: Mapping[str, str]) -> dict[str, tuple[str, str]]:
    """lang -> (the tokeniser that made the stored tokens, the one text.tokenizers names now),
    where they differ; {} when they agree or the captions carry no identities."""
    stored = tokenizer_names(catalog.table_notes("captions", dataset).get("tokenizers") or {})
    wanted = {lang: tokenizer_name(lang, overrides) for lang in languages}
    return {lang: (stored[lang], name) for lang, name in wanted.items() if lang in stored and stored[lang] != name}


def caption_tokenizers(catalog: Catalog, dataset: str, languages: Iterable[str], overrides: Mapping[str, str],
                       stage: str) -> dict[str, str]:  # fmt: skip
    """lang -> the identity of the tokeniser that made the captions' tokens (what a model
    trained on them carries); TokenizerChangedError when text.tokenizers names another."""
    languages = list(languages)
    differ = changed(catalog, dataset, languages, overrides)
    if differ:
        said = ", ".join(f"{lang}: {old} -> {new}" for lang, (old, new) in differ.items())
        raise TokenizerChangedError(
            f"text.tokenizers changed since the captions were tokenised ({said}): the {stage} stage would use tokens "
            f"that another tokeniser made; run ingest and the stages after it first (`mule run {stage}` with the same "
            "--set does, when it sees the change)")  # fmt: skip
    stored = catalog.table_notes("captions", dataset).get("tokenizers") or {}
    return {lang: stored.get(lang) or tokenizer_version(lang, overrides) for lang in languages}
