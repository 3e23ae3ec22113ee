"""LP: pretrain the MULE layers (word embeddings + per-language FC) on sentences of the
same image across languages, before joint training."""

from __future__ import annotations

from typing import Any

import torch

from mule.data_catalog.model_files import save_model
from mule.data_catalog.splits import load_split, load_vocabulary
from mule.mule_core.batching import captions_per_image
from mule.mule_core.devices import resolve_device, use_cpu_threads
from mule.mule_core.encoding import cross_lingual
from mule.mule_core.metrics import mean_r1
from mule.mule_core.model import build_model
from mule.mule_core.progress import SHOWN
from mule.mule_core.training.lp import LPTrainer
from mule.tasks.shared.checkpoints import fit_checkpointed, history_records, phase_seconds
from mule.tasks.shared.context import StageContext, logger
from mule.tasks.shared.token_identity import caption_tokenizers


def compute(ctx: StageContext) -> dict[str, Any]:
    catalog, cfg = ctx.catalog, ctx.cfg
    log, dataset = logger(), cfg.data.dataset
    if not cfg.pretrain.enabled:
        log.info("LP is switched off (pretrain.enabled=false); joint training will start from the word vectors", extra=SHOWN)
        return {"skipped": "pretrain.enabled=false"}
    vocabulary = load_vocabulary(catalog, dataset, cfg.data.languages, cfg.model)
    if len(vocabulary.languages) < 2:
        log.info("LP needs two languages or more; dataset %s has %s: skipped", dataset, vocabulary.languages, extra=SHOWN)
        return {"skipped": f"one language ({', '.join(vocabulary.languages)})"}
    tokenizers = caption_tokenizers(catalog, dataset, vocabulary.languages, cfg.text.tokenizers, "pretrain")
    train = load_split(catalog, dataset, "train", vocabulary, cfg.text.max_tokens, captions=cfg.data.captions)
    val = load_split(catalog, dataset, "val", vocabulary, cfg.text.max_tokens)
    device = resolve_device(cfg.train.device)
    threads = use_cpu_threads(cfg.train.threads)  # in the key: the count changes the weights
    torch.manual_seed(cfg.train.seed)  # the same initial weights on every run
    model = build_model(cfg.model, vocabulary, image_dim=None)

    def validate(m):
        table = cross_lingual(m, val, device, "mule")
        return mean_r1(table), table

    trainer = LPTrainer(model, train, cfg.loss, cfg.train, device, pretrain=cfg.pretrain, validate=validate)
    log.info("LP on %d captions (%s) of %d images; captions per image %s (a batch draws up to %s of an image's); "
             "device %s, %d CPU thread(s)", len(train.caption_image), cfg.data.captions, train.n_images,
             captions_per_image(train.caption_image, train.caption_lang, train.languages),
             _draws(trainer.sentences_per_image), device, threads, extra=SHOWN)  # fmt: skip

    def metrics(result) -> dict:
        out = {f"lp.{k}": v for k, v in result.losses.items()}
        out["lp.val_cross_lingual_r1"] = result.score
        out["lp.sentences_per_second"] = result.sentences_per_second
        return out | {f"lp.val.{pair}.r1": row["r1"] for pair, row in (result.validation or {}).items()}

    path = catalog.lp_model_path(cfg)

    def keep(history) -> None:
        save_model(path, model, cfg, vocabulary, kind="lp", best_epoch=trainer.best_epoch, val_score=trainer.best_score,
                   tokenizers=tokenizers)  # fmt: skip

    # LP checkpoints every epoch and resumes as joint training does
    history, seconds = fit_checkpointed(ctx, trainer, catalog.lp_checkpoint_path(cfg), "pretrain", metrics, keep)
    log.info("LP done: best epoch %d, val cross-lingual R@1 %.1f (MULE layer)", trainer.best_epoch, trainer.best_score, extra=SHOWN)
    return {"path": str(path), "captions": len(train.caption_image), "best_epoch": trainer.best_epoch,
            "val_cross_lingual_r1": trainer.best_score, "seconds": seconds,
            "phases": phase_seconds(history), "history": history_records(history)}  # fmt: skip


def _draws(per_image: dict[str, int]) -> str:
    return ", ".join(f"{lang} {n}" for lang, n in per_image.items())
