"""The training loop that LP and joint training share: pure PyTorch, callers bring tensors.
What differs between the two kinds (their settings, their losses) is in lp.py and joint.py.
Here: a batch's losses (the kind's, plus LC and the fine-tuned words' pull), epochs,
validation, and when training ends, decided in one place (`finished`). The parts it is
made of own their state: how a loss becomes a step of the weights (updates.py), which
epoch is kept and patience (best_epoch.py), the divergence guard (guard.py); a checkpoint
(state_dict / load_state_dict, so an interrupted run resumes) is their states and the
loop's own: the epoch, the history, why it stopped.
"""

from __future__ import annotations

import logging
import math
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from mule.mule_core.batching import Batch, ImageBatchSampler, duplicate_ids
from mule.mule_core.devices import resolve_device  # noqa: F401 - where the training stages find it
from mule.mule_core.losses import image_sentence_loss, neighborhood_loss
from mule.mule_core.model import MuleModel, TextEncoding
from mule.mule_core.progress import SHOWN, Progress, format_seconds
from mule.mule_core.split_tensors import SplitTensors
from mule.mule_core.training.average import cpu_copy
from mule.mule_core.training.best_epoch import BestEpoch, stopped_for
from mule.mule_core.training.guard import GUARD_ACTIONS, DivergenceGuard
from mule.mule_core.training.records import Constraints, EpochResult, EpochTotals, Schedule, sentences_per_image
from mule.mule_core.training.shared_losses import adversary_scale, language_adversary, word_pull
from mule.mule_core.training.updates import Updates

if TYPE_CHECKING:
    from mule.mule_core.settings import LossConfig, TrainConfig

__all__ = ["Constraints", "EpochResult", "Schedule", "Trainer", "sentences_per_image"]
log = logging.getLogger("mule.training")
PROGRESS_EVERY = 20.0  # seconds between epoch lines on the console (each epoch's losses: the run's log)


class Trainer(ABC):
    """The loop both kinds share; a kind (LPTrainer, JointTrainer) says what it trains
    (`trained_parameters`), how it encodes text (`joint_text`) and its losses (`objective`).
    Both take the rest (word learning rate, clipping, seed, sampling, AMP, LC, the pull of
    fine-tuned words, the divergence guard) from the config's `train` and `loss` sections."""

    kind = ""  # the logs' name for it: "lp" or "joint"
    joint_text = False  # whether text is encoded to the joint space (joint training) or MULE only (LP)

    def __init__(self, model: MuleModel, data: SplitTensors, loss: LossConfig, train: TrainConfig,
                 device: torch.device, schedule: Schedule, validate: Callable[[MuleModel], tuple[float, dict]] | None):  # fmt: skip
        if train.divergence not in GUARD_ACTIONS:
            raise ValueError(f"divergence must be one of {GUARD_ACTIONS}, got {train.divergence!r}")
        self.model, self.data, self.loss, self.train, self.schedule = model.to(device), data, loss, train, schedule
        self.device, self.validate = device, validate
        self.lr, self.sentences_per_image = schedule.lr, schedule.sentences_per_image
        self.mining_warmup_steps = schedule.mining_warmup_steps
        torch.manual_seed(train.seed)
        self.sampler = ImageBatchSampler(
            data.caption_image,
            data.caption_lang,
            data.languages,
            self.sentences_per_image,
            schedule.batch_images,
            train.seed,
            balance_groups=train.balance_language_groups,
            caption_text=duplicate_ids(data.tokens, data.lengths, data.caption_lang) if loss.mask_duplicates else None,
        )
        # the parts, each owning its state (a checkpoint is theirs and the loop's)
        self.updates = Updates(model, self.trained_parameters(), device, train, loss, schedule, len(self.sampler))
        self.best = BestEpoch(schedule.patience)
        self.guard = DivergenceGuard(train)
        self._image_sentence_loss, self._neighborhood_loss = image_sentence_loss, neighborhood_loss
        if train.compile:
            self._image_sentence_loss = torch.compile(image_sentence_loss, dynamic=True)
            self._neighborhood_loss = torch.compile(neighborhood_loss, dynamic=True)
        # the loop's own state
        self.epoch = 0
        self.stopped: str | None = None  # why training stopped early, if it did
        self.history: list[EpochResult] = []
        # Where a rollback goes before any epoch was best: the weights training started from.
        self.start_state = cpu_copy(model.state_dict())

    # the parts tests and bench/ read by name (none of them is ever replaced)
    @property
    def epochs(self) -> int:
        return self.schedule.epochs

    @property
    def optimizer(self):
        return self.updates.optimizer

    @property
    def scheduler(self):
        return self.updates.scheduler

    @property
    def average(self):
        return self.updates.average

    @property
    def best_epoch(self) -> int:
        return self.best.epoch

    @property
    def best_score(self) -> float:
        return self.best.score

    @property
    def best_state(self) -> dict | None:
        return self.best.state

    @property
    def best_optimizer(self) -> dict | None:
        return self.best.optimizer

    @property
    def rollbacks(self) -> int:
        return self.guard.rollbacks

    @property
    def first_loss(self) -> float | None:
        return self.guard.first_loss

    @property
    def finished(self) -> bool:
        """Whether training is over: every epoch run, or stopped early (patience, the guard).
        The one place that decides it (the loop, and the checkpoints: tasks/shared/checkpoints.py)."""
        return self.epoch >= self.epochs or self.stopped is not None

    # -- what a kind says ---------------------------------------------------------------
    @abstractmethod
    def trained_parameters(self) -> Iterable[torch.nn.Parameter]:
        """The parameters this kind steps (LP: the MULE layers'; joint: every one that requires a gradient)."""

    @abstractmethod
    def objective(self, batch: Batch, encoded: TextEncoding, mule: torch.Tensor | None,
                  c: Constraints) -> dict[str, torch.Tensor]:  # fmt: skip
        """The kind's losses of one batch (`mule`: the MULE features, normalised; None
        without a MULE layer)."""

    def _nc(self, sentences: torch.Tensor, c: Constraints) -> torch.Tensor:
        """Neighbourhood constraints among `sentences`: those of one image closer than others'."""
        return self._neighborhood_loss(sentences, c.sentence_image, c.pairs, c.margin, c.k, c.same_text)

    def mixed_precision(self, on: bool) -> None:
        """train.amp's arithmetic (mule_core/training/updates.py), switched on or off."""
        self.updates.mixed_precision(on)

    @property
    def step(self) -> int:
        return self.updates.step

    def lc_scale(self) -> float:
        """The adversary's strength on the encoder now (mule_core/training/shared_losses.py)."""
        return adversary_scale(self.loss, self.step)

    # -- one step -------------------------------------------------------------------
    def losses(self, batch: Batch) -> dict[str, torch.Tensor]:
        """One batch's losses: the kind's own (`objective`), then LC and the pull of fine-tuned
        words toward their start, which both kinds share."""
        cfg, dev = self.loss, self.device
        # Mining warm-up: every negative counts until the embeddings are past their first chaos.
        k = cfg.top_k if self.step >= self.mining_warmup_steps else self.schedule.batch_images * 64
        text = self.data.text_batch(batch.captions, batch.groups).to(dev)
        encoded = self.model.encode_text(text, joint=self.joint_text)
        # row-wise: the L2 pull acts on the rows the batch read (a row none reads does not move)
        read = {lang: text.tokens[start:end].unique() for lang, start, end in text.groups} if self.updates.rowwise else None
        sentence_image = batch.sentence_image.to(dev, non_blocking=True)
        pairs = tuple(t.to(dev, non_blocking=True) for t in batch.same_image_pairs)
        same_text = batch.sentence_text.to(dev, non_blocking=True) if batch.sentence_text is not None else None
        # Without a MULE layer (PARALLEL-EmbN, EmbN) there is no MULE-layer NC and no LC.
        mule = F.normalize(encoded.mule, dim=-1) if encoded.mule is not None else None
        parts = self.objective(batch, encoded, mule, Constraints(sentence_image, pairs, self.schedule.margin, k, same_text))
        if cfg.lc and mule is not None and len(batch.groups) > 1:
            language = batch.sentence_lang.to(dev, non_blocking=True)
            parts |= language_adversary(self.model, encoded.mule, language, self.lc_scale())
        return parts | word_pull(self.model, cfg, self.updates.dense_tables, read)

    def _step(self, batch: Batch, lap: Callable[[str], None]) -> tuple[dict[str, torch.Tensor], bool]:
        """One optimizer step on `batch`: its losses (with the total), and whether AMP's
        scaler skipped it."""
        with torch.autocast(self.device.type, dtype=torch.float16, enabled=self.updates.amp):
            parts = self.losses(batch)
            total = sum(v for k, v in parts.items() if k != "lc_accuracy")
        lap("forward")
        skipped = self.updates.apply(total, lap)
        parts["total"] = total
        if self.guard.first_loss is None:  # one host sync, once per training
            self.guard.first_loss = float(total.detach())
        return parts, skipped

    # -- epochs ---------------------------------------------------------------------
    def _train_mode(self) -> None:
        """Training mode, except that a frozen BatchNorm keeps its statistics: adding a
        language to a trained model must leave the image branch exactly as it was."""
        self.model.train()
        for module in self.model.modules():
            if isinstance(module, torch.nn.modules.batchnorm._BatchNorm) and not any(
                p.requires_grad for p in module.parameters()
            ):
                module.eval()

    def run_epoch(self) -> EpochResult:
        if self.stopped:
            raise RuntimeError(f"training stopped: {self.stopped}")
        self._train_mode()
        epoch, totals = self.epoch + 1, EpochTotals()
        progress = Progress(f"{self.kind} epoch {epoch}/{self.epochs}", len(self.sampler), unit="batches", logger=log)
        for batch in self.sampler.batches(epoch):
            totals.lap("batches")
            parts, missed = self._step(batch, totals.lap)
            totals.add(parts, missed, len(batch.captions))
            progress.update(1)
            totals.lap("optimizer")
        if self.updates.average is not None:
            self.updates.average.settle(self.step)  # validation, the kept epoch and checkpoints read every row's average
        if totals.skipped > 1:  # one now and then is AMP finding its scale; many is a model that does not train
            log.warning("%s epoch %d: AMP's scaler skipped %d of %d steps (gradients not finite in float16)",
                        self.kind, epoch, totals.skipped, totals.steps)  # fmt: skip
        result = totals.result(epoch, lr=self.optimizer.param_groups[0]["lr"])
        if self.validate is not None and all(math.isfinite(v) for v in result.losses.values()):
            totals.restart()
            result.score, result.validation = self.validate(self.kept_model)
            totals.lap("validation")
        result.phases = {k: round(v, 3) for k, v in totals.phases.items()}
        self._close_epoch(result)
        return result

    def _close_epoch(self, result: EpochResult) -> None:
        """The epoch's verdict: diverged (and the guard's action), or the best so far (kept),
        or neither; then it joins the history."""
        result.divergence = self.guard.reading(result.losses, result.score, self.best.score, self.best.epoch)
        result.is_best = self.best.consider(result, self.kept_model, self.optimizer)
        self.epoch = result.epoch
        if result.divergence is not None:
            result.action = self.guard.respond(self, result.epoch)
            log.warning("%s epoch %d diverged: %s; %s", self.kind, result.epoch, result.divergence, result.action)
        self.history.append(result)

    # -- the weight average (train.ema) --------------------------------------------------
    @property
    def kept_model(self) -> MuleModel:
        """What validation sees and training keeps: the averaged weights when train.ema is on."""
        return self.updates.kept_model

    def fit(self, on_epoch_end: Callable[[EpochResult], None] | None = None) -> list[EpochResult]:
        started, first_epoch = time.perf_counter(), self.epoch
        shown = started
        while not self.finished:
            result = self.run_epoch()
            now = time.perf_counter()
            per_epoch = (now - started) / (self.epoch - first_epoch)  # validation included
            eta = format_seconds(per_epoch * (self.epochs - self.epoch))
            losses, score = result.described()
            log.info("%s epoch %d/%d: %s; %.0f sentences/s%s; ETA %s", self.kind, result.epoch, self.epochs,
                     losses, result.sentences_per_second, score, eta)  # fmt: skip
            if now - shown >= PROGRESS_EVERY or self.epoch == self.epochs:  # the console: every 20 s, and the last
                shown = now
                log.info("%s: epoch %d/%d (%.1f s/epoch, %.0f sentences/s%s, ETA %s)", self.kind, result.epoch,
                         self.epochs, per_epoch, result.sentences_per_second, score, eta, extra=SHOWN)  # fmt: skip
            reason = self.best.without_progress(self.epoch, self.epochs, result.score) if not self.stopped else None
            if reason:
                self.stopped = reason
                stopped_for(reason, self.kind, self.epoch, self.epochs)
            if on_epoch_end is not None:
                on_epoch_end(result)
        if self.best.state is not None:
            self.model.load_state_dict(self.best.state)
        return self.history

    # -- checkpoints: the parts' states and the loop's ----------------------------------
    def state_dict(self) -> dict:
        """Everything an interrupted run needs to go on as if never stopped: tensors, numbers
        and strings (torch's weights_only loader reads it)."""
        return {"model": self.model.state_dict(), "epoch": self.epoch, "stopped": self.stopped,
                "history": [vars(r) for r in self.history], "updates": self.updates.state_dict(),
                "best": self.best.state_dict(self.epoch), "guard": self.guard.state_dict()}  # fmt: skip

    def load_state_dict(self, state: dict) -> None:
        """The trainer as state_dict found it."""
        self.model.load_state_dict(state["model"])
        self.updates.load_state_dict(state["updates"])
        self.guard.load_state_dict(state["guard"])
        self.epoch, self.stopped = state["epoch"], state.get("stopped")
        self.history = [EpochResult(**r) for r in state["history"]]
        self.best.load_state_dict(state["best"], self.kept_model, self.optimizer)
