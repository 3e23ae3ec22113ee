"""What the training loop takes and gives: a kind's schedule (from its config section), the
constraints a batch's losses compare, each epoch's record, and the sentences per image a
batch draws."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple

import torch

from mule.mule_core.batching import default_sentences_per_image
from mule.mule_core.split_tensors import SplitTensors

if TYPE_CHECKING:
    from mule.mule_core.settings import PretrainConfig, TrainConfig


def sentences_per_image(
    train: TrainConfig, data: SplitTensors, pretrain: PretrainConfig | None = None
) -> dict[str, int]:
    """Sentences per image in a batch, per language: for languages with several captions,
    train.sentences_per_image_many (or, for LP, pretrain.sentences_per_image_many), else 1;
    train.sentences_per_image overrides."""
    many = pretrain.sentences_per_image_many if pretrain is not None else train.sentences_per_image_many
    counts = default_sentences_per_image(data.caption_image, data.caption_lang, data.languages, many)
    counts.update({k: v for k, v in train.sentences_per_image.items() if k in counts})
    return counts


@dataclass(frozen=True)
class Schedule:
    """What a kind of training takes from its own config section (LP: pretrain, joint: train)."""

    epochs: int
    lr: float
    batch_images: int
    lr_decay: float  # per decay_steps
    decay_steps: int  # 0: one epoch's steps
    warmup_steps: int
    mining_warmup_steps: int  # every negative counts before this step, the top k after
    margin: float
    ema: float  # the weight average's decay; 0: the raw weights are kept
    patience: int  # epochs without a better validation score before stopping; 0: never
    sentences_per_image: dict[str, int]


class Constraints(NamedTuple):
    """What a batch's losses compare: each sentence's image row, the pairs of sentences of
    one image (both orders), the margin, the top k mined (every negative before mining
    starts), and each sentence's text id (copies are not negatives), as mule_core/losses.py
    takes them."""

    sentence_image: torch.Tensor
    pairs: tuple[torch.Tensor, torch.Tensor]
    margin: float
    k: int
    same_text: torch.Tensor | None


@dataclass
class EpochResult:
    epoch: int  # 1-based
    losses: dict[str, float]
    seconds: float
    sentences_per_second: float
    score: float | None = None  # validation score (higher is better)
    validation: dict | None = None
    is_best: bool = False
    lr: float | None = None  # at the end of the epoch
    divergence: str | None = None  # why the guard fired this epoch, if it did
    action: str | None = None  # what it did about it
    # seconds per phase: batches (sampling), forward, backward, optimizer (clipping, the step,
    # the weight average), validation; on CUDA the device's queue may blur them
    phases: dict | None = None

    def described(self) -> tuple[str, str]:
        """Its losses and its validation score, as the log lines write them."""
        losses = ", ".join(f"{k} {v:.4f}" for k, v in self.losses.items())
        score = "" if self.score is None else f"; val {self.score:.2f}{' (best)' if self.is_best else ''}"
        return losses, score


class EpochTotals:
    """An epoch's running sums while its steps go: each loss summed on the device (no host
    sync per step), the steps, the ones AMP's scaler skipped, the sentences seen, and the
    seconds per phase (`lap(phase)` adds the time since the last lap to it)."""

    PHASES = ("batches", "forward", "backward", "optimizer", "validation")

    def __init__(self):
        self.sums: dict[str, torch.Tensor] = {}
        self.steps = self.skipped = self.sentences = 0
        self.started = self.clock = time.perf_counter()
        self.phases = dict.fromkeys(self.PHASES, 0.0)

    def restart(self) -> None:
        """The clock from now: what ran since the last lap belongs to no phase."""
        self.clock = time.perf_counter()

    def lap(self, phase: str) -> None:
        now = time.perf_counter()
        self.phases[phase] += now - self.clock
        self.clock = now

    def add(self, parts: dict[str, torch.Tensor], skipped: bool, sentences: int) -> None:
        for key, value in parts.items():
            self.sums[key] = self.sums.get(key, 0.0) + value.detach().float()
        self.steps, self.skipped, self.sentences = self.steps + 1, self.skipped + skipped, self.sentences + sentences

    def result(self, epoch: int, lr: float) -> EpochResult:
        """The epoch's record, before validation: mean losses, sentences per second."""
        seconds = time.perf_counter() - self.started
        losses = {k: float(v) / max(self.steps, 1) for k, v in self.sums.items()}
        return EpochResult(epoch, losses, seconds, self.sentences / seconds, lr=lr)
