"""The losses both kinds of training add to their own (mule_core/training/loop.py): the
adversarial language classifier (LC, through gradient reversal) and the pull of
fine-tuned words toward where they started."""

from __future__ import annotations

import math

import torch

from mule.mule_core.losses import language_classifier_loss
from mule.mule_core.model import MuleModel
from mule.mule_core.settings import LossConfig


def adversary_scale(loss: LossConfig, step: int) -> float:
    """The adversary's strength on the encoder at `step`: DANN's schedule (Ganin & Lempitsky,
    2015), 2 / (1 + exp(-10 p)) - 1 with p = step / lc_ramp_steps, times loss.lc_weight."""
    ramp = loss.lc_ramp_steps
    p = min(1.0, step / ramp) if ramp > 0 else 1.0
    return loss.lc_weight * (2.0 / (1.0 + math.exp(-10.0 * p)) - 1.0)


def language_adversary(model: MuleModel, mule: torch.Tensor, language: torch.Tensor,
                       scale: float) -> dict[str, torch.Tensor]:  # fmt: skip
    """LC on the MULE features (before normalising) of sentences in `language` (their ids).
    The classifier learns at full strength (a weak adversary teaches nothing); the encoder
    receives its gradient reversed and scaled by `scale` (lambda2, ramped: adversary_scale)."""
    logits = model.classify_language(mule, reverse_scale=scale)
    return {"lc": language_classifier_loss(logits, language),
            "lc_accuracy": (logits.argmax(1) == language).float().mean().detach()}  # fmt: skip


def word_pull(model: MuleModel, loss: LossConfig, dense_tables, read: dict | None) -> dict[str, torch.Tensor]:
    """loss.word_l2's pull of fine-tuned word vectors toward their start: the dense tables'
    own (mule_core/training/updates.py) when they hold the words, else over the rows `read` (row-wise
    updates: a row no batch read does not move) or every row. Nothing when no word trains."""
    pull = dense_tables.pull_loss() if dense_tables is not None else None
    if pull is not None:
        return {"word_l2": pull}
    if loss.word_l2 > 0 and any(b.embed.weight.requires_grad for b in model.branches.values()):
        return {"word_l2": loss.word_l2 * model.word_drift(read)}
    return {}
