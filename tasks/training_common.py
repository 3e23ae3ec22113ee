"""Pieces the pretrain and train tasks share."""

from __future__ import annotations

import numpy as np
import torch

from mule_core.batching import default_sentences_per_image
from mule_core.config import MuleConfig
from mule_core.metrics import cross_lingual_recalls
from mule_core.model import MuleModel
from mule_core.training import OptimConfig, SplitTensors, encode_split


def sentences_per_image(cfg: MuleConfig, train: SplitTensors, lp: bool = False) -> dict[str, int]:
    """Per-image sentence counts from the data (train.sentences_per_image_many for languages
    with several captions; LP keeps the paper's 2: its all-pairs constraints grow with the
    square of it), with the config's overrides."""
    many = 2 if lp else cfg.train.sentences_per_image_many
    counts = default_sentences_per_image(train.caption_image, train.caption_lang, train.languages, many)
    counts.update({k: v for k, v in cfg.train.sentences_per_image.items() if k in counts})
    return counts


def optim_config(cfg: MuleConfig, train: SplitTensors, lp: bool) -> OptimConfig:
    section = cfg.pretrain if lp else cfg.train
    return OptimConfig(
        epochs=section.epochs,
        lr=section.lr,
        lr_decay=1.0 if lp else cfg.train.lr_decay,
        word_lr_scale=cfg.train.word_lr_scale,
        grad_clip=cfg.train.grad_clip,
        batch_images=section.batch_images,
        sentences_per_image=sentences_per_image(cfg, train, lp),
        seed=cfg.train.seed,
        balance_language_groups=cfg.train.balance_language_groups,
        amp=cfg.train.amp,
        compile=cfg.train.compile,
        warmup_steps=0 if lp else cfg.train.warmup_steps,
        decay_steps=cfg.train.decay_steps,
        divergence=cfg.train.divergence,
        divergence_drop=cfg.train.divergence_drop,
        divergence_lr_factor=cfg.train.divergence_lr_factor,
        divergence_retries=cfg.train.divergence_retries,
        ema=0.0 if lp else cfg.train.ema,
    )


def cross_lingual(model: MuleModel, data: SplitTensors, device: torch.device, layer: str) -> dict:
    """Cross-lingual sentence retrieval at the MULE ("mule") or multimodal ("joint") layer."""
    encoded = encode_split(model, data, device, joint=layer == "joint")
    emb = (
        encoded["caption_joint"] if layer == "joint" else torch.nn.functional.normalize(encoded["caption_mule"], dim=-1)
    )
    return cross_lingual_recalls(
        emb,
        torch.from_numpy(data.caption_image).to(device),
        torch.from_numpy(data.caption_lang).to(device),
        data.languages,
    )


def mean_r1(table: dict) -> float:
    return float(np.mean([row["r1"] for row in table.values()])) if table else 0.0


def record_divergence(tracker, trainer, result, stage: str) -> None:
    """The guard's verdict on an epoch, where people look: a warning in the run's log (the
    trainer's) and MLflow tags on the stage's run: the first epoch that diverged, and the
    latest divergence with what the guard did about it."""
    if result.divergence is None:
        return
    first = next(r.epoch for r in [*trainer.history, result] if r.divergence)
    tracker.tags({"mule.diverged": "true", "mule.diverged_epoch": str(first),
                  f"mule.{stage}.divergence": f"epoch {result.epoch}: {result.divergence}",
                  f"mule.{stage}.divergence_action": result.action or ""})  # fmt: skip
