"""The training loop that LP and joint training share: Pure PyTorch, callers bring tensors.
What differs between the two kinds (their settings, their losses) is in
mule_core/lp_training.py and mule_core/joint_training.py; this is one step (the losses'
backward pass, clipping, the optimizer, the weight average), one epoch, validation with the
best epoch kept, the divergence guard's actions, early stopping, and checkpoints
(state_dict / load_state_dict, so an interrupted run resumes).

Schedules count optimizer steps, not epochs, so that one config behaves the same on 3,000
and on 120,000 images (an epoch of the latter is 40 times as many steps): the learning
rate warms up linearly over `warmup_steps` and decays by `lr_decay` every
`decay_steps`; the adversary's gradient reversal ramps up over `loss.lc_ramp_steps`.
"""

from __future__ import annotations

import logging
import math
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple

import torch
import torch.nn.functional as F

from mule.mule_core.batching import Batch, ImageBatchSampler, default_sentences_per_image, duplicate_ids
from mule.mule_core.dense_tables import DenseTables
from mule.mule_core.devices import resolve_device  # noqa: F401 - where the training stages find it
from mule.mule_core.divergence import GUARD_ACTIONS, divergence
from mule.mule_core.losses import image_sentence_loss, language_classifier_loss, neighborhood_loss
from mule.mule_core.model import MuleModel, TextEncoding
from mule.mule_core.progress import SHOWN, Progress, format_seconds
from mule.mule_core.row_updates import RowAdam, clip_grad_norm, coalesced, sparse_tables
from mule.mule_core.split_tensors import SplitTensors
from mule.mule_core.weight_average import BEST_IS_KEPT, ModelAverage, cpu_copy, fused_adam

if TYPE_CHECKING:
    from mule.mule_core.settings import LossConfig, PretrainConfig, TrainConfig

log = logging.getLogger("mule.training")
PROGRESS_EVERY = 20.0  # seconds between epoch lines on the console (each epoch's losses: the run's log)


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
        self.epochs, self.lr, self.patience = schedule.epochs, schedule.lr, schedule.patience
        self.sentences_per_image, self.mining_warmup_steps = schedule.sentences_per_image, schedule.mining_warmup_steps
        torch.manual_seed(train.seed)
        params = list(self.trained_parameters())
        words = {id(p) for b in model.branches.values() for p in b.word_parameters()}
        # train.word_updates=rows: the tables' gradients are the rows a batch read, and those
        # alone step (mule_core/row_updates.py); dense: every row, every step
        self.rowwise = train.word_updates == "rows"
        # dense updates: the tables' gradients built by hand (mule_core/dense_tables.py), autograd's numbers in fewer passes
        self.tables = sparse_tables(model, True) if self.rowwise else []
        self.dense_tables = None if self.rowwise else DenseTables(model.branches.values(), loss.word_l2) or None
        self.optimizer = (RowAdam if self.rowwise else torch.optim.Adam)(
            [
                {"params": [p for p in params if id(p) not in words]},
                {"params": [p for p in params if id(p) in words], "lr": self.lr * train.word_lr_scale},
            ],
            lr=self.lr,
            fused=fused_adam(device),
        )
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
        self.mixed_precision(train.amp and device.type == "cuda")
        self._image_sentence_loss, self._neighborhood_loss = image_sentence_loss, neighborhood_loss
        if train.compile:
            self._image_sentence_loss = torch.compile(image_sentence_loss, dynamic=True)
            self._neighborhood_loss = torch.compile(neighborhood_loss, dynamic=True)
        self.decay_steps = schedule.decay_steps or len(self.sampler)
        self.lr_scale = 1.0  # lowered by the divergence guard's rollbacks
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, self._lr_factor)
        self.epoch = 0
        self.best_score = -math.inf
        self.best_epoch = 0
        self.best_state: dict | None = None
        self.best_optimizer: dict | None = None
        # Where a rollback goes before any epoch was best: the weights training started from.
        self.start_state = cpu_copy(model.state_dict())
        self.first_loss: float | None = None  # the total loss of training's first batch
        self.rollbacks = 0
        # The averaged model: validated, kept and saved in place of the raw weights when on.
        self.average = ModelAverage(model, schedule.ema, self.optimizer, self.tables) if schedule.ema > 0 else None
        self.stopped: str | None = None  # why training stopped early, if it did
        self.history: list[EpochResult] = []

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
        """train.amp's arithmetic: float16 autocast and a GradScaler on the trainer's device.
        On by default on CUDA alone; on the CPU it is slower than float32, and there only to
        check AMP where no GPU is (tests, bench/train_on_workdir.py --cpu-amp)."""
        self.amp = on
        self.scaler = torch.amp.GradScaler(self.device.type, enabled=on)

    # -- schedules (in optimizer steps) ------------------------------------------------
    @property
    def step(self) -> int:
        return self.scheduler.last_epoch  # LambdaLR counts the steps it was stepped

    def _lr_factor(self, step: int) -> float:
        warmup = self.schedule.warmup_steps
        warm = min(1.0, (step + 1) / warmup) if warmup > 0 else 1.0
        return warm * self.schedule.lr_decay ** (step / self.decay_steps) * self.lr_scale

    def lc_scale(self) -> float:
        """The adversary's strength on the encoder now: DANN's schedule (Ganin & Lempitsky,
        2015), 2 / (1 + exp(-10 p)) - 1 with p = step / lc_ramp_steps, times loss.lc_weight."""
        ramp = self.loss.lc_ramp_steps
        p = min(1.0, self.step / ramp) if ramp > 0 else 1.0
        return self.loss.lc_weight * (2.0 / (1.0 + math.exp(-10.0 * p)) - 1.0)

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
        read = {lang: text.tokens[start:end].unique() for lang, start, end in text.groups} if self.rowwise else None
        sentence_image = batch.sentence_image.to(dev, non_blocking=True)
        pairs = tuple(t.to(dev, non_blocking=True) for t in batch.same_image_pairs)
        same_text = batch.sentence_text.to(dev, non_blocking=True) if batch.sentence_text is not None else None
        # Without a MULE layer (PARALLEL-EmbN, EmbN) there is no MULE-layer NC and no LC.
        mule = F.normalize(encoded.mule, dim=-1) if encoded.mule is not None else None
        parts = self.objective(batch, encoded, mule, Constraints(sentence_image, pairs, self.schedule.margin, k, same_text))
        if cfg.lc and mule is not None and len(batch.groups) > 1:
            # The classifier learns at full strength (a weak adversary teaches nothing); the
            # encoder receives its gradient reversed and scaled by lc_scale() (lambda2, ramped).
            logits = self.model.classify_language(encoded.mule, reverse_scale=self.lc_scale())
            language = batch.sentence_lang.to(dev, non_blocking=True)
            parts["lc"] = language_classifier_loss(logits, language)
            parts["lc_accuracy"] = (logits.argmax(1) == language).float().mean().detach()
        pull = self.dense_tables.pull_loss() if self.dense_tables is not None else None
        if pull is not None:
            parts["word_l2"] = pull
        elif cfg.word_l2 > 0 and any(b.embed.weight.requires_grad for b in self.model.branches.values()):
            parts["word_l2"] = cfg.word_l2 * self.model.word_drift(read)
        return parts

    def _step(self, batch: Batch, lap: Callable[[str], None]) -> tuple[dict[str, torch.Tensor], bool]:
        """One optimizer step on `batch`: its losses (with the total), and whether AMP's
        scaler skipped it."""
        with torch.autocast(self.device.type, dtype=torch.float16, enabled=self.amp):
            parts = self.losses(batch)
            total = sum(v for k, v in parts.items() if k != "lc_accuracy")
        lap("forward")
        self.optimizer.zero_grad(set_to_none=True)
        self.scaler.scale(total).backward()
        lap("backward")
        scale = self.scaler.get_scale() if self.amp else 1.0
        if self.dense_tables is not None:
            self.dense_tables.gradients(scale)
        if self.rowwise:
            coalesced(self.tables)
        if self.train.grad_clip > 0:
            self.scaler.unscale_(self.optimizer)
            # the tables' norms from the rows read (AMP's unscaling would have to reach them: not under AMP)
            known = self.dense_tables.norms if self.dense_tables is not None and not self.amp else None
            clip_grad_norm([p for p in self.model.parameters() if p.grad is not None], self.train.grad_clip, known)
        moved = self.average.rows_about_to_move(self.tables, self.step) if self.average is not None else {}
        self.scaler.step(self.optimizer)
        self.scaler.update()
        skipped = self.amp and self.scaler.get_scale() < scale  # the scaler skipped the step: gradients not finite
        if skipped and self.dense_tables is not None:
            self.dense_tables.reset()
        self.scheduler.step()
        if self.average is not None:
            self.average.update(self.step, moved)
        parts["total"] = total
        if self.first_loss is None:  # one host sync, once per training
            self.first_loss = float(total.detach())
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
        epoch = self.epoch + 1
        sums: dict[str, float] = {}
        steps = skipped = sentences = 0
        started = time.perf_counter()
        progress = Progress(f"{self.kind} epoch {epoch}/{self.epochs}", len(self.sampler), unit="batches", logger=log)
        phases = dict.fromkeys(("batches", "forward", "backward", "optimizer", "validation"), 0.0)
        clock = time.perf_counter()

        def lap(phase: str) -> None:
            nonlocal clock
            now = time.perf_counter()
            phases[phase] += now - clock
            clock = now

        for batch in self.sampler.batches(epoch):
            lap("batches")
            parts, missed = self._step(batch, lap)
            skipped += missed
            for key, value in parts.items():  # summed on the device: no host sync per step
                sums[key] = sums.get(key, 0.0) + value.detach().float()
            steps += 1
            sentences += len(batch.captions)
            progress.update(1)
            lap("optimizer")
        if self.average is not None:
            self.average.settle(self.step)  # validation, the kept epoch and checkpoints read every row's average
        if skipped > 1:  # one now and then is AMP finding its scale; many is a model that does not train
            log.warning("%s epoch %d: AMP's scaler skipped %d of %d steps (gradients not finite in float16)",
                        self.kind, epoch, skipped, steps)  # fmt: skip
        seconds = time.perf_counter() - started
        result = EpochResult(
            epoch, {k: float(v) / max(steps, 1) for k, v in sums.items()}, seconds, sentences / seconds,
            lr=self.optimizer.param_groups[0]["lr"],
        )  # fmt: skip
        if self.validate is not None and all(math.isfinite(v) for v in result.losses.values()):
            clock = time.perf_counter()
            result.score, result.validation = self.validate(self.kept_model)
            lap("validation")
        result.phases = {k: round(v, 3) for k, v in phases.items()}
        self._close_epoch(result)
        return result

    def _close_epoch(self, result: EpochResult) -> None:
        """The epoch's verdict: the divergence guard's reading and action, else a better
        score kept as the best epoch."""
        result.divergence = divergence(self.train, result.losses, result.score, self.first_loss, self.best_score,
                                       self.best_epoch)  # fmt: skip
        if result.divergence is None and result.score is not None and result.score > self.best_score:
            result.is_best = True
            self.best_score, self.best_epoch = result.score, result.epoch
            # the last best's copies go before the new ones are made: one set in memory, not
            # two (on the real text each set is 1.1 GB, and a checkpoint being written holds 1.4)
            self.best_state = self.best_optimizer = None
            self.best_state = cpu_copy(self.kept_model.state_dict())
            self.best_optimizer = cpu_copy(self.optimizer.state_dict())
        self.epoch = result.epoch
        if result.divergence is not None:
            result.action = self._handle_divergence(result)
        self.history.append(result)

    # -- weight averaging ---------------------------------------------------------------
    @property
    def kept_model(self) -> MuleModel:
        """What validation sees and training keeps: the averaged weights when train.ema is on."""
        return self.average.model if self.average is not None else self.model

    @property
    def ema(self) -> MuleModel | None:
        """The averaged model (train.ema), None when the raw weights are kept."""
        return self.average.model if self.average is not None else None

    @property
    def row_averages(self) -> dict:
        return self.average.rows if self.average is not None else {}

    # -- the divergence guard's actions (mule_core/divergence.py reads the epoch) ----------
    def _handle_divergence(self, result: EpochResult) -> str:
        mode = self.train.divergence
        if mode == "warn":
            action = "warned only (divergence=warn)"
        elif mode == "rollback" and self.rollbacks < self.train.divergence_retries:
            self.rollbacks += 1
            self.lr_scale *= self.train.divergence_lr_factor
            if self.best_state is not None:
                self._load_weights(self.best_state)
                self.optimizer.load_state_dict(self.best_optimizer)
                where = f"epoch {self.best_epoch}"
            else:
                self._load_weights(self.start_state)
                self.optimizer.state.clear()  # Adam's moments from diverged steps would carry it away again
                where = "the starting weights"
            for group, base in zip(self.optimizer.param_groups, self.scheduler.base_lrs):
                group["lr"] = base * self._lr_factor(self.step)
            action = (f"rolled back to {where}, learning rate x{self.lr_scale:g} "
                      f"(rollback {self.rollbacks} of {self.train.divergence_retries})")  # fmt: skip
        else:
            reason = "divergence=stop" if mode == "stop" else f"{self.rollbacks} rollbacks did not help"
            self.stopped = f"diverged at epoch {result.epoch} ({reason})"
            if self.best_state is None:  # no good epoch: what training started from beats diverged weights
                self._load_weights(self.start_state)
                action = f"stopped ({reason}); no epoch was good, the starting weights are kept"
            else:
                action = f"stopped ({reason}); the best epoch is kept"
        log.warning("%s epoch %d diverged: %s; %s", self.kind, result.epoch, result.divergence, action)
        return action

    def _load_weights(self, state: dict) -> None:
        self.model.load_state_dict(state)
        if self.average is not None:
            self.average.model.load_state_dict(state)
            self.average.restart(self.step)
        if self.dense_tables is not None:  # the gradients that led here (NaN, after a divergence) go
            self.dense_tables.reset()

    def fit(self, on_epoch_end: Callable[[EpochResult], None] | None = None) -> list[EpochResult]:
        started, first_epoch = time.perf_counter(), self.epoch
        shown = started
        while self.epoch < self.epochs and not self.stopped:
            result = self.run_epoch()
            now = time.perf_counter()
            per_epoch = (now - started) / (self.epoch - first_epoch)  # validation included
            eta = format_seconds(per_epoch * (self.epochs - self.epoch))
            losses = ", ".join(f"{k} {v:.4f}" for k, v in result.losses.items())
            score = "" if result.score is None else f"; val {result.score:.2f}{' (best)' if result.is_best else ''}"
            log.info("%s epoch %d/%d: %s; %.0f sentences/s%s; ETA %s", self.kind, result.epoch, self.epochs,
                     losses, result.sentences_per_second, score, eta)  # fmt: skip
            if now - shown >= PROGRESS_EVERY or self.epoch == self.epochs:  # the console: every 20 s, and the last
                shown = now
                log.info("%s: epoch %d/%d (%.1f s/epoch, %.0f sentences/s%s, ETA %s)", self.kind, result.epoch,
                         self.epochs, per_epoch, result.sentences_per_second, score, eta, extra=SHOWN)  # fmt: skip
            self._stop_without_progress(result)
            if on_epoch_end is not None:
                on_epoch_end(result)
        if self.best_state is not None:
            self.model.load_state_dict(self.best_state)
        return self.history

    def _stop_without_progress(self, result: EpochResult) -> None:
        """train.patience (pretrain.patience for LP): stop once that many epochs have passed
        without a better validation score, before the epoch's checkpoint records it."""
        if self.patience and not self.stopped and result.score is not None and self.epoch < self.epochs:
            if self.epoch - self.best_epoch >= self.patience:
                self.stopped = (f"no better validation score for {self.epoch - self.best_epoch} epochs after epoch "
                                f"{self.best_epoch} ({self.best_score:.2f}): patience {self.patience}")  # fmt: skip
                log.info("%s: stopped at epoch %d of %d: %s", self.kind, self.epoch, self.epochs, self.stopped,
                         extra=SHOWN)  # fmt: skip

    # -- checkpoints ----------------------------------------------------------------
    def state_dict(self) -> dict:
        # Right after a best epoch (most epochs while validation climbs) its copies equal
        # the kept weights and the optimizer's state: named, not stored again (LP on the
        # real text: 4 copies of 89 M parameters a checkpoint instead of 7)
        best_is_now = self.best_state is not None and self.best_epoch == self.epoch
        return {
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "scaler": self.scaler.state_dict(),
            "epoch": self.epoch,
            "best_score": self.best_score,
            "best_epoch": self.best_epoch,
            "best_state": BEST_IS_KEPT if best_is_now else self.best_state,
            "best_optimizer": BEST_IS_KEPT if best_is_now else self.best_optimizer,
            "lr_scale": self.lr_scale,
            "rollbacks": self.rollbacks,
            "stopped": self.stopped,
            "first_loss": self.first_loss,
            "history": [vars(r) for r in self.history],
            "ema": self.ema.state_dict() if self.ema is not None else None,
        }

    def load_state_dict(self, state: dict) -> None:
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.lr_scale, self.rollbacks = state.get("lr_scale", 1.0), state.get("rollbacks", 0)
        self.stopped, self.best_optimizer = state.get("stopped"), state.get("best_optimizer")
        self.first_loss = state.get("first_loss")
        self.scheduler.load_state_dict(state["scheduler"])
        if state.get("scaler"):
            self.scaler.load_state_dict(state["scaler"])
        self.epoch = state["epoch"]
        self.best_score, self.best_epoch, self.best_state = (
            state["best_score"],
            state["best_epoch"],
            state["best_state"],
        )
        self.history = [EpochResult(**r) for r in state["history"]]
        if self.average is not None:
            self.average.model.load_state_dict(state.get("ema") or state["model"])
            self.average.restart(self.step)  # checkpoints hold settled averages
        if isinstance(self.best_state, str):  # BEST_IS_KEPT: the epoch saved was the best
            self.best_state = cpu_copy(self.kept_model.state_dict())
        if isinstance(self.best_optimizer, str):
            self.best_optimizer = cpu_copy(self.optimizer.state_dict())


