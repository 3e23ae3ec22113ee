"""Translate the query: a model's English branch searched with queries in other languages,
translated into English word by word. The `query-translation` step: of the ablation (each
English EmbN model: "one English model and a dictionary", the paper's baseline) and of
add-language (the base model, with each added language's queries: the row beside the
added branch that says whether a dictionary would have done as well).

Each language's word table into English is the best the run has, said in the result:
a MUSE lexicon (`<dictionaries>/en-<lang>.txt`); else one induced by IBM Model 1 from the
dataset's own translated training captions (Multi30K's task1: de, fr, cs); else each word
to its nearest English word by multilingual-e5 (`aligned`: any language e5 reads, no
parallel text). English words the branch was trained on are the candidates.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from mule.data_catalog import queries
from mule.data_catalog.entries import added_from_tables
from mule.data_catalog.model_files import load_model
from mule.data_catalog.sources import locate
from mule.data_catalog.splits import load_split
from mule.data_catalog.tables import write_json_atomic
from mule.datasets.lexicons import english_lexicons
from mule.mule_core.devices import resolve_device
from mule.mule_core.encoding import evaluate_split
from mule.mule_core.errors import UserError
from mule.mule_core.progress import SHOWN
from mule.mule_core.vocabulary import word_translator
from mule.tasks.shared.context import StageContext, logger
from mule.words.translation import WordTable

ENGLISH = "en"


def compute(ctx: StageContext) -> dict[str, Any]:
    """mR per query language (English itself, and each other language translated) of the
    model cfg.output.model_name's English branch on the evaluation split."""
    wd, catalog, cfg = ctx.workdir, ctx.catalog, ctx.cfg
    dataset = cfg.data.dataset
    out = wd.model_results_dir(dataset, cfg.output.model_name)
    path = wd.model_path(dataset, cfg.output.model_name)
    model, meta = load_model(path)
    if ENGLISH not in meta["vocabulary"].languages:
        raise UserError(f"{path} has no English branch to read translated queries: {meta['vocabulary'].languages}")
    english = replace(meta["vocabulary"], languages=[ENGLISH], vocabs={ENGLISH: meta["vocabulary"].vocabs[ENGLISH]})
    added = tuple(added_from_tables(cfg))
    # add-language's: the languages it adds; the ablation's: the dataset's other languages
    wanted = list(cfg.add.added) if cfg.add.added else [x for x in cfg.data.languages if x != ENGLISH]
    folder = cfg.data.dictionaries or str(locate(wd, cfg.data).root / "dictionaries")
    tables, how = word_tables(ctx, wanted, english.vocabs[ENGLISH].tokens[2:], folder, added)
    device = resolve_device(cfg.train.device)
    table = {}
    for lang in [ENGLISH, *tables]:
        words = tables.get(lang)
        try:  # the query language's captions, translated word by word, read as English sentences
            data = load_split(catalog, dataset, cfg.eval.split, replace(english, languages=[lang],
                              vocabs={lang: english.vocabs[ENGLISH]}), meta["cfg"].text.max_tokens, meta["extractor"],
                              rewrite=(lambda tokens, words=words: words.translate(tokens)[0]) if words else None,
                              added=tuple(x for x in added if x == lang))  # fmt: skip
        except UserError:  # no captions of the language in the split: nothing to measure
            continue
        data.languages = [ENGLISH]
        data.unseen = {ENGLISH: data.unseen[lang]} if data.unseen else None
        table[lang] = evaluate_split(model, data, device, cfg.eval.ks)[ENGLISH]
        if lang != ENGLISH:
            logger().info("translate the query, %s -> en word by word (%s), read by %s's English branch: mR %.1f", lang,
                          how[lang], path.stem, table[lang]["mR"], extra=SHOWN)  # fmt: skip
    missing = [lang for lang in wanted if lang not in tables and lang not in how]
    if missing:
        logger().warning("no word table into English for %s (no lexicon in %s, no parallel captions, and e5 cannot "
                         "read them): their queries were not translated", ", ".join(missing), folder)  # fmt: skip
    summary = {"model": str(path), "split": cfg.eval.split, "table": table, "lexicons": folder,
               "languages": sorted(lang for lang in tables if lang in table), "tables": how,
               "parameters": meta["parameters"]}  # fmt: skip
    write_json_atomic(summary, out / "translated_queries.json")
    return summary


def word_tables(ctx: StageContext, languages: list[str], english_words: list[str], folder: str,
                added: tuple[str, ...]) -> tuple[dict[str, WordTable], dict[str, str]]:  # fmt: skip
    """Per language, its word table into English and how it was made: a lexicon, else
    induced from the dataset's parallel training captions, else aligned by e5."""
    from mule.tasks.translate import induced_backend

    cfg, catalog = ctx.cfg, ctx.catalog
    tables, how = {}, {}
    lexicons = english_lexicons(folder, languages)
    if lexicons:
        counts = queries.training_word_counts(catalog, cfg.data.dataset, ENGLISH)
        for lang, pairs in lexicons.items():
            tables[lang], how[lang] = WordTable(word_translator(pairs, counts)), f"lexicon {folder}/en-{lang}.txt"
    rest = [lang for lang in languages if lang not in tables and lang not in added]
    if rest:
        induced = induced_backend(cfg, catalog, [(lang, ENGLISH) for lang in rest], required=False)
        for (src, _), table in induced.tables.items():
            tables[src], how[src] = table, "induced: IBM Model 1 on the dataset's translated training captions"
    for lang in (x for x in languages if x not in tables):
        words = queries.split_words(catalog, cfg.data.dataset, cfg.eval.split, lang, added=lang in added)
        if not words:  # no caption of it in the split: nothing to translate, nothing missing
            how[lang] = f"none: no {lang} captions in {cfg.eval.split}"
            continue
        try:
            from mule.words.translation import word_table

            tables[lang] = WordTable(word_table(words, lang, ENGLISH, list(english_words), cfg.text.tokenizers))
            how[lang] = "aligned: each word to its nearest English word by multilingual-e5"
        except UserError as error:  # e5 is not installed: said, and the language is left out
            logger().warning("no aligned word table %s -> en: %s", lang, error)
    return tables, how
