"""What training keeps beside the weights: the moving average of the model (train.ema)
and its per-step weight, the kept best epoch as a detached CPU copy, and Adam's fused
kernel where torch has one."""

from __future__ import annotations

import copy

import torch
from torch import nn

from mule.mule_core.training.row_updates import RowAverage


def fused_adam(device: torch.device) -> bool | None:
    """Adam's fused kernel where torch has one for the device: one pass over each tensor
    instead of a dozen. The same update; with subword vectors (89 M parameters on
    Multi30K, every one stepped every batch) the for-loop Adam was 30% of an LP step on
    the CPU (0.49 s of 1.7), the fused one 0.05 s."""
    return True if device.type in ("cpu", "cuda") else None


BEST_IS_KEPT = "the kept weights and the optimizer's state"  # a checkpoint's best copies, when they are those


def cpu_copy(state):
    """A detached CPU copy of a (nested) state dict: the kept best epoch must not move with training."""
    if isinstance(state, torch.Tensor):
        return state.detach().to("cpu", copy=True)
    if isinstance(state, dict):
        return {k: cpu_copy(v) for k, v in state.items()}
    if isinstance(state, list):
        return [cpu_copy(v) for v in state]
    return copy.deepcopy(state)



def ema_weight(decay: float, step: int) -> float:
    """The weight of step `step`'s parameters (1-based) in the moving average: Adam's bias
    correction, (1 - d) / (1 - d^t). The average is then exactly the d-weighted mean of every
    step's parameters so far (weights d^(t-i), normalised): the first step's parameters
    replace the random start, and the decay given is the decay used from the first step on
    (the former warm-up, min(d, (1 + t) / (10 + t)), held every d >= 0.999 below d until step
    8,990, so 0.999 and 0.9995 trained the same model)."""
    if decay <= 0:
        return 1.0
    return (1.0 - decay) / (1.0 - decay ** max(1, step))


class ModelAverage:
    """The moving average of a model's weights (train.ema): a copy that validation sees and
    training keeps. Averaged step by step: what the optimizer moves; the word tables stepped
    row by row (`tables`: train.word_updates=rows) are averaged row by row, each row brought
    up to the steps it sat still when it next moves. The rest (LP's shared encoder and
    image branch, frozen weights) equals its average from the copy on, and a lerp towards
    itself leaves it so: skipped, the same numbers."""

    def __init__(self, model: nn.Module, decay: float, optimizer: torch.optim.Optimizer, tables: list[torch.Tensor]):
        self.live, self.decay = model, decay
        self.model = copy.deepcopy(model)
        self.model.requires_grad_(False)
        averaged = dict(self.model.named_parameters())
        self.rows: dict[int, RowAverage] = {}  # a table's id -> its average, row by row
        for name, p in model.named_parameters():
            if any(p is t for t in tables):
                self.rows[id(p)] = RowAverage(averaged[name].data, p.data, decay, 0)
        moving = {id(p) for group in optimizer.param_groups for p in group["params"]}
        self.pairs = [(averaged[name], p) for name, p in model.named_parameters()
                      if id(p) in moving and id(p) not in self.rows]  # fmt: skip

    @torch.no_grad()
    def rows_about_to_move(self, tables: list[torch.Tensor], step: int) -> dict[int, torch.Tensor]:
        """The rows of each row-averaged table this step moves (its gradient's), their averages
        first brought up to the steps they sat still."""
        moved = {}
        for p in tables:
            if id(p) in self.rows and p.grad is not None:
                rows = p.grad.coalesce().indices()[0]
                self.rows[id(p)].catch_up(rows, step)
                moved[id(p)] = rows
        return moved

    @torch.no_grad()
    def update(self, step: int, moved: dict[int, torch.Tensor]) -> None:
        """This step's average: every parameter the optimizer moves, except the tables
        averaged row by row: those, of the rows that moved."""
        weight = ema_weight(self.decay, step)
        torch._foreach_lerp_([a for a, _ in self.pairs], [p.detach() for _, p in self.pairs], weight)
        for key, rows in moved.items():
            self.rows[key].lerp(rows, weight, step)
        for mine, theirs in zip(self.model.buffers(), self.live.buffers()):  # BatchNorm statistics
            mine.copy_(theirs)

    @torch.no_grad()
    def settle(self, step: int) -> None:
        """Every row's average brought up to `step`: validation, the kept epoch and
        checkpoints read all of them."""
        for average in self.rows.values():
            average.settle(step)

    def restart(self, step: int) -> None:
        """The average is the weights now (after a rollback or a resume)."""
        for average in self.rows.values():
            average.restart(step)
