"""Evaluation: per-language recalls (R@1/5/10 both ways, mR) on the test split (or every
split eval.split names: "tests" is every test split the dataset has),
cross-lingual sentence retrieval at the MULE and multimodal layers (image level: any
caption of the query's image; and translation pairs: the query's own translation among
the target language's translated lines, where the split has them), and a few queries
with the images they found. Written to evaluation.json; the tables and figures made from
it are the publisher's (pipeline.publish)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import torch

from mule.data_catalog import queries
from mule.data_catalog.entries import added_from_tables
from mule.data_catalog.model_files import load_model
from mule.data_catalog.splits import load_split
from mule.data_catalog.tables import write_json_atomic
from mule.datasets.generated import embedded_ceiling
from mule.mule_core.devices import resolve_device
from mule.mule_core.encoding import cross_lingual, encode_split, evaluate_split, translation_ceilings, translation_pairs
from mule.mule_core.errors import MissingInputError
from mule.mule_core.metrics import chance_table, mean_mr
from mule.mule_core.progress import SHOWN
from mule.mule_core.split_tensors import SplitTensors
from mule.tasks.shared.context import StageContext, logger


def retrieval_examples(model, data: SplitTensors, catalog, dataset: str, device, per_language: int,
                       encoded: dict[str, torch.Tensor] | None = None, added=()) -> list[dict]:  # fmt: skip
    """A few sentence -> image queries per language, with their top 5 images."""
    encoded = encoded if encoded is not None else encode_split(model, data, device)
    paths = queries.image_paths(catalog, dataset)
    rng = np.random.default_rng(0)
    chosen = []
    for index, lang in enumerate(data.languages):
        rows = np.nonzero(data.caption_lang == index)[0]
        chosen += [(lang, int(r)) for r in rng.choice(rows, size=min(per_language, len(rows)), replace=False)]
    texts = queries.caption_texts(catalog, dataset, [data.caption_ids[r] for _, r in chosen], added)
    examples = []
    for lang, row in chosen:
        scores = encoded["image"] @ encoded["caption_joint"][row]
        top = torch.topk(scores, 5).indices.tolist()
        examples.append({"lang": lang, "query": texts[data.caption_ids[row]],
                         "paths": [paths[data.image_ids[i]] for i in top],
                         "hits": [bool(i == data.caption_image[row]) for i in top]})  # fmt: skip
    return examples


def _evaluate_text_only(ctx: StageContext, splits: list[tuple[str, str]]) -> dict[str, Any]:
    """No images: cross-lingual sentence retrieval of the LP model at the MULE layer."""
    catalog, cfg, dataset = ctx.catalog, ctx.cfg, ctx.dataset
    path = catalog.lp_model_path(cfg)
    if not path.exists():
        raise MissingInputError(
            f"dataset {dataset!r} has no images, so only the MULE layer can be evaluated, and there is no LP "
            f"model at {path}: run the text and pretrain stages first"
        )
    logger().info("dataset %s has no image files: evaluating cross-lingual retrieval of the LP model (MULE layer)",
                  dataset, extra=SHOWN)  # fmt: skip
    model, meta = load_model(path)
    device = resolve_device(cfg.train.device)
    out = ctx.workdir.results_dir(dataset)
    results = {}
    for selector, name in splits:
        data = load_split(catalog, dataset, selector, meta["vocabulary"], meta["cfg"].text.max_tokens)
        results[name] = {"split": name, "mean_mR": None, "table": {},
                         "cross_lingual": {"mule": cross_lingual(model, data, device, "mule")},
                         "translation_pairs": {"mule": translation_pairs(model, data, device, "mule")},
                         "translation_ceiling": {"mule": translation_ceilings(model, data, device, "mule")},
                         "images": 0, "sentences": len(data.caption_image), "languages": list(data.languages)}  # fmt: skip
    return _summary(ctx, results, {"model": str(path), "best_epoch": meta.get("best_epoch"), "examples": [],
                                   "results_dir": str(out)})  # fmt: skip


def _summary(ctx: StageContext, results: dict[str, dict], common: dict) -> dict[str, Any]:
    """The headline split's results at the top (the first of eval.split), every split's
    under "splits"; written to evaluation.json."""
    headline = next(iter(results))
    summary = {**results[headline], **common, "splits": results}
    write_json_atomic(summary, Path(common["results_dir"]) / "evaluation.json")
    return summary


def compute(ctx: StageContext) -> dict[str, Any]:
    wd, catalog, cfg = ctx.workdir, ctx.catalog, ctx.cfg
    dataset = cfg.data.dataset
    splits = queries.evaluation_splits(catalog, dataset, cfg.eval.split)
    if not splits:
        raise MissingInputError(f"eval.split={cfg.eval.split!r} names no split")
    if queries.image_file_count(catalog, dataset) == 0:
        return _evaluate_text_only(ctx, splits)
    path = wd.model_path(dataset, cfg.output.model_name)
    model, meta = load_model(path)
    device = resolve_device(cfg.train.device)
    layers = ("mule", "joint") if model.has_mule else ("joint",)
    out = wd.model_results_dir(dataset, cfg.output.model_name)
    results = {}
    # a language added to a trained model: its captions are in a table of their own (add.languages names it)
    added = tuple(x for x in added_from_tables(cfg) if x in meta["vocabulary"].languages)
    for number, (selector, name) in enumerate(splits):
        data = load_split(catalog, dataset, selector, meta["vocabulary"], meta["cfg"].text.max_tokens,
                          meta["extractor"], added=added)  # fmt: skip
        encoded = encode_split(model, data, device)  # once: every measure below reads these vectors
        table = evaluate_split(model, data, device, cfg.eval.ks, encoded)
        # a random ranking of the same images and sentences: 31 photos make chance mR 17, not 0.5
        chance = chance_table(torch.from_numpy(data.caption_image), torch.from_numpy(data.caption_lang),
                              data.languages, cfg.eval.ks)  # fmt: skip
        result = {"split": name, "mean_mR": mean_mr(table), "table": table, "images": data.n_images,
                  "chance": chance, "chance_mean_mR": mean_mr(chance),
                  "cross_lingual": {layer: cross_lingual(model, data, device, layer, encoded) for layer in layers},
                  "translation_pairs": {layer: translation_pairs(model, data, device, layer, encoded) for layer in layers},
                  "translation_ceiling": {layer: translation_ceilings(model, data, device, layer, encoded)
                                          for layer in layers},
                  "languages": list(data.languages)}  # fmt: skip
        ceiling = embedded_ceiling(wd, cfg.data, selector)
        if ceiling:  # what a model that knew every scene would score: how far there is to go
            result["ceiling"] = {lang: ceiling[lang] for lang in table if lang in ceiling}
        if number == 0:  # the headline split's retrieved images
            result["examples"] = (retrieval_examples(model, data, catalog, dataset, device, cfg.eval.examples, encoded,
                                                     added) if cfg.eval.examples > 0 else [])  # fmt: skip
        results[name] = result
        logger().info("%s mean mR %.2f (%d images; chance %.1f)", name, result["mean_mR"], data.n_images,
                      result["chance_mean_mR"], extra=SHOWN)  # fmt: skip
    return _summary(ctx, results, {"model": str(path), "best_epoch": meta.get("best_epoch"), "results_dir": str(out)})


def read_results(workdir, dataset: str) -> dict | None:
    path = workdir.results_dir(dataset) / "evaluation.json"
    return json.loads(path.read_text()) if path.exists() else None
