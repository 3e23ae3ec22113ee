"""LP: pretrain the MULE layers (word embeddings + per-language FC) on sentences of the
same image across languages, before joint training."""

from __future__ import annotations

import time
from typing import Any

import torch
from prefect import task
from prefect.cache_policies import NO_CACHE

from experiments import plots
from experiments.tracking import Tracker
from mule_core.training import Trainer, resolve_device

from .common import context, logger
from .model_io import build_model, load_split, load_vocabulary, save_model
from .training_common import cross_lingual, mean_r1, optim_config, record_divergence


@task(name="language-pretraining", cache_policy=NO_CACHE)
def pretrain_mule(workdir: str, config: dict[str, Any], run_id: str | None) -> dict[str, Any]:
    wd, catalog, cfg = context(workdir, config)
    log, dataset, tracker = logger(), cfg.data.dataset, Tracker(wd, run_id)
    if not cfg.pretrain.enabled:
        log.info("LP is switched off (pretrain.enabled=false); joint training will start from the word vectors")
        tracker.tags({"mule.skipped": "pretrain.enabled=false"})
        return {"skipped": True}
    vocabulary = load_vocabulary(catalog, dataset, cfg.data.languages)
    if len(vocabulary.languages) < 2:
        log.info("LP needs two languages or more; dataset %s has %s: skipped", dataset, vocabulary.languages)
        return {"skipped": True}
    train = load_split(catalog, dataset, "train", vocabulary, cfg.text.max_tokens, captions=cfg.data.captions)
    val = load_split(catalog, dataset, "val", vocabulary, cfg.text.max_tokens)
    device = resolve_device(cfg.train.device)
    torch.manual_seed(cfg.train.seed)  # the same initial weights on every run
    model = build_model(cfg, vocabulary, image_dim=None)
    optim = optim_config(cfg, train, lp=True)
    log.info("LP on %d captions (%s) of %d images; sentences per image %s; device %s",
             len(train.caption_image), cfg.data.captions, train.n_images, optim.sentences_per_image, device)  # fmt: skip

    def validate(m):
        table = cross_lingual(m, val, device, "mule")
        return mean_r1(table), table

    trainer = Trainer(model, train, cfg.loss, optim, device, mode="lp", validate=validate)

    def on_epoch(result) -> None:
        metrics = {f"lp.{k}": v for k, v in result.losses.items()}
        metrics["lp.val_cross_lingual_r1"] = result.score
        metrics["lp.sentences_per_second"] = result.sentences_per_second
        metrics |= {f"lp.val.{pair}.r1": row["r1"] for pair, row in (result.validation or {}).items()}
        tracker.metrics(metrics, step=result.epoch)
        record_divergence(tracker, trainer, result, "pretrain")

    started = time.perf_counter()
    history = trainer.fit(on_epoch)
    path = catalog.lp_model_path(cfg.data)
    save_model(path, model, cfg, vocabulary, kind="lp", best_epoch=trainer.best_epoch, val_score=trainer.best_score)
    figure = plots.training_curves(history, "LP: neighborhood constraints at the MULE layer",
                                   score_label="val cross-lingual R@1 (MULE)")  # fmt: skip
    tracker.figure(figure, "lp_curves.png")
    plots.close(figure)
    summary = {"path": str(path), "captions": len(train.caption_image), "best_epoch": trainer.best_epoch, "val_cross_lingual_r1": trainer.best_score,
               "seconds": round(time.perf_counter() - started, 1)}  # fmt: skip
    tracker.metrics({"lp.best_epoch": trainer.best_epoch, "lp.best_val_cross_lingual_r1": trainer.best_score})
    log.info("LP done: best epoch %d, val cross-lingual R@1 %.1f (MULE layer)", trainer.best_epoch, trainer.best_score)
    return summary
