"""Evaluation: per-language recall table (R@1/5/10 both ways, mR) on the test split,
cross-lingual sentence retrieval at the MULE and multimodal layers, and figures."""

from __future__ import annotations

import functools
import json
from typing import Any

import numpy as np
import torch
from prefect import task
from prefect.cache_policies import NO_CACHE

from data_catalog import queries
from data_catalog.catalog import write_json_atomic, write_text_atomic
from data_catalog.datasets import embedded_ceiling
from experiments import plots, registry
from experiments.report import cross_lingual_markdown, recall_markdown, recall_rows, to_csv
from experiments.tracking import Tracker
from mule_core.errors import MissingInputError
from mule_core.metrics import mean_mr
from mule_core.training import SplitTensors, encode_split, evaluate_split, resolve_device

from .common import context, logger
from .model_io import load_model, load_split
from .training_common import cross_lingual


def retrieval_examples(model, data: SplitTensors, catalog, dataset: str, device, per_language: int) -> list[dict]:
    """A few sentence -> image queries per language, with their top 5 images."""
    encoded = encode_split(model, data, device)
    paths = queries.image_paths(catalog, dataset)
    rng = np.random.default_rng(0)
    chosen = []
    for index, lang in enumerate(data.languages):
        rows = np.nonzero(data.caption_lang == index)[0]
        chosen += [(lang, int(r)) for r in rng.choice(rows, size=min(per_language, len(rows)), replace=False)]
    texts = queries.caption_texts(catalog, dataset, [data.caption_ids[r] for _, r in chosen])
    examples = []
    for lang, row in chosen:
        scores = encoded["image"] @ encoded["caption_joint"][row]
        top = torch.topk(scores, 5).indices.tolist()
        examples.append({"lang": lang, "query": texts[data.caption_ids[row]],
                         "paths": [paths[data.image_ids[i]] for i in top],
                         "hits": [i == data.caption_image[row] for i in top]})  # fmt: skip
    return examples


def _write_outputs(out, tracker, summary: dict, figures: dict, files: dict[str, str]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        write_text_atomic(text, out / name)
    write_json_atomic(summary, out / "evaluation.json")
    for name, figure in figures.items():
        plots.save(figure, out / name)
        plots.close(figure)
        tracker.artifact(out / name)  # the file just written: rendering it again for MLflow costs as much
    for name in (*files, "evaluation.json"):
        tracker.artifact(out / name)


def _cross_lingual_metrics(crossing: dict) -> dict[str, float]:
    return {f"test.xling.{layer}.{pair}.r{k}": row[f"r{k}"]
            for layer, t in crossing.items() for pair, row in t.items() for k in (1, 5, 10)}  # fmt: skip


def _evaluate_text_only(wd, catalog, cfg, tracker, log) -> dict[str, Any]:
    """No images: cross-lingual sentence retrieval of the LP model at the MULE layer."""
    dataset = cfg.data.dataset
    path = catalog.lp_model_path(cfg.data)
    if not path.exists():
        raise MissingInputError(
            f"dataset {dataset!r} has no images, so only the MULE layer can be evaluated, and there is no LP "
            f"model at {path}: run the text and pretrain stages first"
        )
    log.info("dataset %s has no image files: evaluating cross-lingual retrieval of the LP model (MULE layer)", dataset)
    model, meta = load_model(path)
    device = resolve_device(cfg.train.device)
    data = load_split(catalog, dataset, cfg.eval.split, meta["vocabulary"], meta["cfg"].text.max_tokens)
    crossing = {"mule": cross_lingual(model, data, device, "mule")}
    markdown = cross_lingual_markdown(crossing)
    summary = {"split": cfg.eval.split, "model": str(path), "best_epoch": meta.get("best_epoch"), "mean_mR": None,
               "table": {}, "cross_lingual": crossing, "images": 0, "sentences": len(data.caption_image)}  # fmt: skip
    figures = {"cross_lingual_mule.png": plots.cross_lingual_heatmap(crossing["mule"], data.languages,
                                                                     f"{dataset} {cfg.eval.split}: sentence -> sentence, MULE layer")}  # fmt: skip
    _write_outputs(wd.results_dir(dataset), tracker, summary, figures, {"cross_lingual.md": markdown + "\n"})
    tracker.metrics(_cross_lingual_metrics(crossing))
    log.info("cross-lingual retrieval (%s, %d captions):\n%s", cfg.eval.split, len(data.caption_image), markdown)
    return summary | {"markdown": markdown, "results_dir": str(wd.results_dir(dataset))}


@task(name="evaluate", cache_policy=NO_CACHE)
def evaluate_model(workdir: str, config: dict[str, Any], run_id: str | None) -> dict[str, Any]:
    wd, catalog, cfg = context(workdir, config)
    log, dataset, tracker = logger(), cfg.data.dataset, Tracker(wd, run_id)
    if queries.image_file_count(catalog, dataset) == 0:
        return _evaluate_text_only(wd, catalog, cfg, tracker, log)
    path = wd.model_path(dataset, cfg.train.model_name)
    model, meta = load_model(path)
    device = resolve_device(cfg.train.device)
    reader = functools.partial(catalog.read_features, dataset)
    data = load_split(catalog, dataset, cfg.eval.split, meta["vocabulary"], meta["cfg"].text.max_tokens,
                      (meta["extractor"], reader))  # fmt: skip
    table = evaluate_split(model, data, device, cfg.eval.ks)
    layers = ("mule", "joint") if model.has_mule else ("joint",)
    crossing = {layer: cross_lingual(model, data, device, layer) for layer in layers}
    markdown = recall_markdown(table)
    summary = {"split": cfg.eval.split, "model": str(path), "best_epoch": meta.get("best_epoch"),
               "mean_mR": mean_mr(table), "table": table, "cross_lingual": crossing}  # fmt: skip
    ceiling = embedded_ceiling(wd, cfg.data, cfg.eval.split)
    if ceiling:  # what a model that knew every scene would score: how far there is to go
        summary["ceiling"] = {lang: ceiling[lang] for lang in table if lang in ceiling}
    figures = {"recalls.png": plots.recall_bars(table, f"{dataset} {cfg.eval.split}: retrieval per language")}
    for layer, crossing_table in crossing.items():
        if crossing_table:
            figures[f"cross_lingual_{layer}.png"] = plots.cross_lingual_heatmap(
                crossing_table, data.languages, f"sentence -> sentence, {layer} layer"
            )
    if cfg.eval.examples > 0:
        figures["retrieved_images.png"] = plots.retrieved_images(
            retrieval_examples(model, data, catalog, dataset, device, cfg.eval.examples)
        )
    out = wd.model_results_dir(dataset, cfg.train.model_name)
    _write_outputs(out, tracker, summary, figures, {"recalls.md": markdown + "\n",
                                                    "recalls.csv": to_csv(recall_rows(table)),
                                                    "cross_lingual.md": cross_lingual_markdown(crossing) + "\n"})  # fmt: skip
    metrics = {f"test.{lang}.{k}": v for lang, row in table.items() for k, v in row.items()}
    metrics["test.mean_mR"] = summary["mean_mR"]
    for lang, row in summary.get("ceiling", {}).items():
        metrics[f"ceiling.{lang}.mR"] = row["mR"]
    tracker.metrics(metrics | _cross_lingual_metrics(crossing))
    log.info("test recalls (%s, %d images):\n%s", cfg.eval.split, data.n_images, markdown)
    if cfg.train.model_name == "model":
        summary["registered_version"] = registry.tag_test_results(wd, dataset, meta.get("mlflow_run_id"),
                                                                  summary["mean_mR"], table)  # fmt: skip
    return summary | {"markdown": markdown, "results_dir": str(out)}


def read_results(workdir, dataset: str) -> dict | None:
    path = workdir.results_dir(dataset) / "evaluation.json"
    return json.loads(path.read_text()) if path.exists() else None
