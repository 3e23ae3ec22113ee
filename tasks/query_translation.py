"""Translate the query: an English-only model searched with queries in the other languages,
translated into English word by word through bilingual lexicons (the ablation's baseline
for "one English model and a dictionary"). The `query-translation` step of the ablation
sweep, run on each English model (cfg.train.model_name)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from mule.data_catalog import queries
from mule.data_catalog.model_files import load_model
from mule.data_catalog.sources import locate
from mule.data_catalog.splits import load_split
from mule.data_catalog.tables import write_json_atomic
from mule.datasets.lexicons import english_lexicons
from mule.mule_core.devices import resolve_device
from mule.mule_core.encoding import evaluate_split
from mule.mule_core.vocabulary import translate_tokens, word_translator
from mule.tasks.shared.context import StageContext, logger


def compute(ctx: StageContext) -> dict[str, Any]:
    """mR per query language (English itself, and each language with an en-<lang> lexicon)
    of the English model cfg.train.model_name on the evaluation split."""
    wd, catalog, cfg = ctx.workdir, ctx.catalog, ctx.cfg
    dataset = cfg.data.dataset
    folder = cfg.data.dictionaries or str(locate(wd, cfg.data).root / "dictionaries")
    lexicons = english_lexicons(folder, [lang for lang in cfg.data.languages if lang != "en"])
    out = wd.model_results_dir(dataset, cfg.train.model_name)
    path = wd.model_path(dataset, cfg.train.model_name)
    model, meta = load_model(path)
    if meta["vocabulary"].languages != ["en"]:
        raise ValueError(f"{path} is not an English-only model: {meta['vocabulary'].languages}")
    english = meta["vocabulary"]
    counts = queries.training_word_counts(catalog, dataset, "en")
    device = resolve_device(cfg.train.device)
    table = {}
    for lang in ["en", *lexicons]:
        # the query language's captions, translated word by word, read as English sentences
        words = word_translator(lexicons[lang], counts) if lang != "en" else {}
        data = load_split(catalog, dataset, cfg.eval.split, replace(english, languages=[lang],
                          vocabs={lang: english.vocabs["en"]}), meta["cfg"].text.max_tokens, meta["extractor"],
                          rewrite=lambda tokens, words=words: translate_tokens(tokens, words))  # fmt: skip
        data.languages = ["en"]
        data.unseen = {"en": data.unseen[lang]} if data.unseen else None
        table[lang] = evaluate_split(model, data, device, cfg.eval.ks)["en"]
    if not lexicons:
        logger().warning("no en-<lang>.txt lexicons in %s: only English queries were evaluated", folder)
    summary = {"model": str(path), "split": cfg.eval.split, "table": table, "lexicons": folder,
               "languages": sorted(lexicons), "parameters": meta["parameters"]}  # fmt: skip
    write_json_atomic(summary, out / "translated_queries.json")
    return summary
