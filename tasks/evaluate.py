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

from data_catalog.catalog import write_json_atomic
from mule_core.metrics import mean_mr
from mule_core.training import SplitTensors, encode_split, evaluate_split, resolve_device

from . import plots
from .common import context, logger
from .model_io import load_model, load_split
from .report import cross_lingual_markdown, recall_markdown, recall_rows, to_csv
from .tracking import Tracker
from .train import model_path
from .training_common import cross_lingual


def retrieval_examples(model, data: SplitTensors, catalog, dataset: str, device, per_language: int) -> list[dict]:
    """A few sentence -> image queries per language, with their top 5 images."""
    encoded = encode_split(model, data, device)
    paths = dict(
        zip(*catalog.query("SELECT image_id, path FROM images WHERE dataset = ?", [dataset]).to_pydict().values())
    )
    rng = np.random.default_rng(0)
    chosen = []
    for index, lang in enumerate(data.languages):
        rows = np.nonzero(data.caption_lang == index)[0]
        chosen += [(lang, int(r)) for r in rng.choice(rows, size=min(per_language, len(rows)), replace=False)]
    texts = dict(
        zip(
            *catalog.query(
                f"SELECT caption_id, text FROM captions WHERE dataset = ? AND caption_id IN ({', '.join('?' * len(chosen))})",
                [dataset, *[data.caption_ids[r] for _, r in chosen]],
            ).to_pydict().values()
        )
    )  # fmt: skip
    examples = []
    for lang, row in chosen:
        scores = encoded["image"] @ encoded["caption_joint"][row]
        top = torch.topk(scores, 5).indices.tolist()
        examples.append({"lang": lang, "query": texts[data.caption_ids[row]],
                         "paths": [paths[data.image_ids[i]] for i in top],
                         "hits": [i == data.caption_image[row] for i in top]})  # fmt: skip
    return examples


@task(name="evaluate", cache_policy=NO_CACHE)
def evaluate_model(workdir: str, config: dict[str, Any], run_id: str | None) -> dict[str, Any]:
    wd, catalog, cfg = context(workdir, config)
    log, dataset, tracker = logger(), cfg.data.dataset, Tracker(wd, run_id)
    model, meta = load_model(model_path(wd, dataset))
    device = resolve_device(cfg.train.device)
    reader = functools.partial(catalog.read_features, dataset)
    data = load_split(catalog, dataset, cfg.eval.split, meta["vocabulary"], meta["cfg"].text.max_tokens,
                      (meta["extractor"], reader))  # fmt: skip
    table = evaluate_split(model, data, device, cfg.eval.ks)
    crossing = {layer: cross_lingual(model, data, device, layer) for layer in ("mule", "joint")}
    markdown = recall_markdown(table)
    summary = {"split": cfg.eval.split, "model": str(model_path(wd, dataset)), "best_epoch": meta.get("best_epoch"),
               "mean_mR": mean_mr(table), "table": table, "cross_lingual": crossing}  # fmt: skip

    out = wd.results_dir(dataset)
    out.mkdir(parents=True, exist_ok=True)
    (out / "recalls.md").write_text(markdown + "\n")
    (out / "recalls.csv").write_text(to_csv(recall_rows(table)))
    (out / "cross_lingual.md").write_text(cross_lingual_markdown(crossing) + "\n")
    write_json_atomic(summary, out / "evaluation.json")
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
    for name, figure in figures.items():
        figure.savefig(out / name, dpi=110)
        tracker.figure(figure, name)
        plots.close(figure)
    for name in ("recalls.md", "recalls.csv", "cross_lingual.md", "evaluation.json"):
        tracker.artifact(out / name)
    metrics = {f"test.{lang}.{k}": v for lang, row in table.items() for k, v in row.items()}
    metrics["test.mean_mR"] = summary["mean_mR"]
    metrics |= {f"test.xling.{layer}.{pair}.r1": row["r1"]
                for layer, t in crossing.items() for pair, row in t.items()}  # fmt: skip
    tracker.metrics(metrics)
    log.info("test recalls (%s, %d images):\n%s", cfg.eval.split, data.n_images, markdown)
    return summary | {"markdown": markdown, "results_dir": str(out)}


def read_results(workdir, dataset: str) -> dict | None:
    path = workdir.results_dir(dataset) / "evaluation.json"
    return json.loads(path.read_text()) if path.exists() else None
