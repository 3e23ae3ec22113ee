"""How a batch's loss becomes a step of the weights, for either kind of training: Adam (or
RowAdam on the rows a batch read), the word tables' gradients, AMP's scaler, clipping, the
learning rate's schedule and the weight average.

Schedules count optimizer steps, not epochs, so that one config behaves the same on 3,000
and on 120,000 images (an epoch of the latter is 40 times as many steps): the learning
rate warms up linearly over `warmup_steps` and decays by `lr_decay` every `decay_steps`,
times `lr_scale`, which the divergence guard's rollbacks lower.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

import torch

from mule.mule_core.model import MuleModel
from mule.mule_core.training.average import ModelAverage, fused_adam
from mule.mule_core.training.dense_tables import DenseTables
from mule.mule_core.training.records import Schedule
from mule.mule_core.training.row_updates import RowAdam, clip_grad_norm, coalesced, sparse_tables

if TYPE_CHECKING:
    from mule.mule_core.settings import LossConfig, TrainConfig


class Updates:
    def __init__(self, model: MuleModel, params: Iterable[torch.nn.Parameter], device: torch.device,
                 train: TrainConfig, loss: LossConfig, schedule: Schedule, steps_per_epoch: int):  # fmt: skip
        self.model, self.device, self.train, self.schedule = model, device, train, schedule
        params = list(params)
        words = {id(p) for b in model.branches.values() for p in b.word_parameters()}
        # train.word_updates=rows: the tables' gradients are the rows a batch read, and those
        # alone step (mule_core/training/row_updates.py); dense: every row, every step
        self.rowwise = train.word_updates == "rows"
        # dense updates: the tables' gradients built by hand (mule_core/training/dense_tables.py), autograd's numbers in fewer passes
        self.tables = sparse_tables(model, True) if self.rowwise else []
        self.dense_tables = None if self.rowwise else DenseTables(model.branches.values(), loss.word_l2) or None
        self.optimizer = (RowAdam if self.rowwise else torch.optim.Adam)(
            [
                {"params": [p for p in params if id(p) not in words]},
                {"params": [p for p in params if id(p) in words], "lr": schedule.lr * train.word_lr_scale},
            ],
            lr=schedule.lr,
            fused=fused_adam(device),
        )
        self.mixed_precision(train.amp and device.type == "cuda")
        self.decay_steps = schedule.decay_steps or steps_per_epoch
        self.lr_scale = 1.0
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, self.lr_factor)
        # The averaged model: validated, kept and saved in place of the raw weights when on.
        self.average = ModelAverage(model, schedule.ema, self.optimizer, self.tables) if schedule.ema > 0 else None

    def mixed_precision(self, on: bool) -> None:
        """train.amp's arithmetic: float16 autocast and a GradScaler on the trainer's device.
        On by default on CUDA alone; on the CPU it is slower than float32, and there only to
        check AMP where no GPU is (tests, bench/train_on_workdir.py --cpu-amp)."""
        self.amp = on
        self.scaler = torch.amp.GradScaler(self.device.type, enabled=on)

    @property
    def step(self) -> int:
        return self.scheduler.last_epoch  # LambdaLR counts the steps it was stepped

    def lr_factor(self, step: int) -> float:
        warmup = self.schedule.warmup_steps
        warm = min(1.0, (step + 1) / warmup) if warmup > 0 else 1.0
        return warm * self.schedule.lr_decay ** (step / self.decay_steps) * self.lr_scale

    def apply(self, total: torch.Tensor, lap: Callable[[str], None]) -> bool:
        """One optimizer step from the batch's total loss; whether AMP's scaler skipped it."""
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
        return skipped

    @property
    def kept_model(self) -> MuleModel:
        """What validation sees and training keeps: the averaged weights when train.ema is on."""
        return self.average.model if self.average is not None else self.model

    def load_weights(self, state: dict) -> None:
        """The weights (and their average) set to `state`, as a rollback or the end of training does."""
        self.model.load_state_dict(state)
        if self.average is not None:
            self.average.model.load_state_dict(state)
            self.average.restart(self.step)
        if self.dense_tables is not None:  # the gradients that led here (NaN, after a divergence) go
            self.dense_tables.reset()

    def state_dict(self) -> dict:
        """Adam's state, the schedules' step, AMP's scale, the rollbacks' learning-rate scale
        and the weight average."""
        return {"optimizer": self.optimizer.state_dict(), "scheduler": self.scheduler.state_dict(),
                "scaler": self.scaler.state_dict(), "lr_scale": self.lr_scale,
                "average": self.average.model.state_dict() if self.average is not None else None}  # fmt: skip

    def load_state_dict(self, state: dict) -> None:
        """As state_dict found it (the model's own weights restored first: an average saved
        without one restarts from them)."""
        self.optimizer.load_state_dict(state["optimizer"])
        self.lr_scale = state.get("lr_scale", 1.0)
        self.scheduler.load_state_dict(state["scheduler"])
        if state.get("scaler"):
            self.scaler.load_state_dict(state["scaler"])
        if self.average is not None:
            self.average.model.load_state_dict(state.get("average") or self.model.state_dict())
            self.average.restart(self.step)  # checkpoints hold settled averages

    def lower_lr(self, factor: float) -> None:
        """The learning rate times `factor` from now on (a rollback's)."""
        self.lr_scale *= factor
        for group, base in zip(self.optimizer.param_groups, self.scheduler.base_lrs):
            group["lr"] = base * self.lr_factor(self.step)
