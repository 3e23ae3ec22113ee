"""Row-wise updates of the word tables: a batch steps only the rows it touched.

On the real Multi30K text the word and n-gram tables hold 85 M of LP's parameters, and a
batch reads a few thousand of their rows. Stepped densely (the default), every batch gives
every row a gradient (mule_core/training/dense_tables.py builds it: the L2 pull toward the initial
vector, plus the rows read), runs Adam over every row and averages every row into the
weight average. With train.word_updates=rows:

- the tables' gradients are sparse: the rows the batch read, once each (`sparse_tables`);
- the L2 pull toward the initial vectors (loss.word_l2) acts on the rows the batch read
  (`MuleModel.word_drift(rows)`): a row no batch reads keeps its value, so it cannot drift;
- Adam steps only those rows, with the row's own moments (`RowAdam`: lazy Adam, as
  torch's SparseAdam and TensorFlow's LazyAdam); every other parameter steps as Adam;
- the weight average of a row is brought up to date when the row moves, in closed form
  for the steps it sat still (`RowAverage`), and for every row before it is read.

This is another optimiser than dense Adam, whose momentum keeps moving a row for about
1 / (1 - beta1) = 10 steps after a batch read it (and whose L2 pull, normalised by Adam,
keeps pulling rows no batch reads): a word read once moves about a tenth as far. On the
real text LP's epochs are 10-35% faster and its validation R@1 about a point lower over
three seeds (docs/benchmarks-journal.md, "Row-wise updates"), so `dense` stays the default.
"""

from __future__ import annotations

import math

import torch
from torch import nn

WORD_UPDATES = ("rows", "dense")


def sparse_tables(model: nn.Module, on: bool) -> list[nn.Parameter]:
    """Sets the word and n-gram tables of every language branch to give sparse gradients
    (or dense ones again); returns the tables that are trained."""
    tables = []
    for branch in getattr(model, "branches", {}).values():
        modules = [branch.embed] + ([branch.subwords.vectors] if branch.subwords is not None else [])
        for module in modules:
            module.sparse = on
            if module.weight.requires_grad:
                tables.append(module.weight)
    return tables


def coalesced(parameters) -> None:
    """Each sparse gradient with its duplicate rows summed (a row read twice in a batch,
    by a word and by its L2 pull), as Adam and the norm need it."""
    for p in parameters:
        grad = p.grad
        if grad is None or not grad.is_sparse or grad.is_coalesced():
            continue
        rows = grad._indices()[0]
        if len(rows) < 2 or bool((rows[1:] > rows[:-1]).all()):  # read once each, in order (the n-grams): no sort
            p.grad = torch.sparse_coo_tensor(grad._indices(), grad._values(), grad.shape, is_coalesced=True,
                                             check_invariants=False)
        else:
            p.grad = grad.coalesce()


# How far under max_norm a norm known from the rows (float32 sums in another order than a
# pass over the table's) must be for clipping to be skipped without the exact norm
KNOWN_NORM_MARGIN = 1e-3


def clip_grad_norm(parameters, max_norm: float, known: dict[int, torch.Tensor] | None = None) -> torch.Tensor:
    """torch.nn.utils.clip_grad_norm_ for dense and coalesced sparse gradients (torch's
    counts a sparse gradient's duplicate rows apart, which is another norm). On the CPU the
    gradients are scaled only when the norm is over `max_norm`: torch multiplies by 1.0
    otherwise (to spare a GPU a host sync), a pass over every table of an LP step for nothing.

    `known`: a parameter's id -> its gradient's norm, known without reading the gradient
    (dense_tables.DenseTables.norms: the word tables' are 85 M numbers on the real text, an
    LP step's pass). On the CPU, when the norm they give is clearly under max_norm, nothing
    is clipped and no other pass is made; else the norm is taken over every gradient as
    before, so that clipping scales by exactly what it did."""
    parameters = list(parameters)
    grads = [p.grad for p in parameters if p.grad is not None]
    if not grads:
        return torch.zeros(())
    if known and all(g.device.type == "cpu" and not g.is_sparse for g in grads):
        norms = [known[id(p)] if id(p) in known else torch.linalg.vector_norm(p.grad, 2.0)
                 for p in parameters if p.grad is not None]  # fmt: skip
        estimate = torch.linalg.vector_norm(torch.stack(norms), 2.0)
        if float(estimate) < max_norm * (1.0 - KNOWN_NORM_MARGIN):  # not a number: not under it
            return estimate
    if not any(g.is_sparse for g in grads):
        total = torch.nn.utils.get_total_norm(grads, 2.0)
        if _scales(total, max_norm):
            torch.nn.utils.clip_grads_with_norm_(parameters, max_norm, total)
        return total
    norms = [(g.values() if g.is_sparse else g).detach().norm(2.0) for g in grads]
    total = torch.linalg.vector_norm(torch.stack([n.to(norms[0].device) for n in norms]), 2.0)
    scale = torch.clamp(max_norm / (total + 1e-6), max=1.0)
    if _scales(total, max_norm):
        for g in grads:
            (g.values() if g.is_sparse else g).mul_(scale.to(g.device))
    return total


def _scales(total: torch.Tensor, max_norm: float) -> bool:
    """Whether clipping changes the gradients: torch's coefficient, max_norm / (total + 1e-6),
    clamped to 1, is under 1 (or not a number). Always true off the CPU (no host sync)."""
    if total.device.type != "cpu":
        return True
    return not bool(max_norm / (total + 1e-6) >= 1.0)


class RowAdam(torch.optim.Adam):
    """Adam, except that a parameter whose gradient is sparse (coalesced) steps only the rows
    its gradient names, with those rows' moments; its bias correction counts the steps the
    parameter took (SparseAdam's rule). Dense parameters step exactly as torch.optim.Adam
    (fused where it can). One optimiser, one state_dict: the scheduler, checkpoints and the
    divergence guard's rollbacks see Adam."""

    @torch.no_grad()
    def step(self, closure=None):
        if closure is not None:
            raise ValueError("RowAdam takes no closure")
        found_inf = getattr(self, "found_inf", None)  # set by a GradScaler (fused Adam scales for it)
        grad_scale = getattr(self, "grad_scale", None)
        held = []
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None or not p.grad.is_sparse:
                    continue
                held.append((p, p.grad))
                if found_inf is None or not bool(found_inf):
                    self._step_rows(p, p.grad, group, grad_scale)
                p.grad = None  # Adam's own step leaves it alone
        try:
            super().step()
        finally:
            for p, grad in held:
                p.grad = grad

    def _step_rows(self, p: torch.Tensor, grad: torch.Tensor, group: dict, grad_scale) -> None:
        grad = grad.coalesce()
        rows, values = grad.indices()[0], grad.values()
        if grad_scale is not None:
            values = values / grad_scale.to(values.device)
        beta1, beta2 = group["betas"]
        state = self.state[p]
        if not state:  # Adam's own layout: a state_dict reads the same either way
            state["step"] = torch.zeros((), dtype=torch.float32, device=p.device)
            state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
        state["step"] += 1
        step = float(state["step"])
        exp_avg = state["exp_avg"].index_select(0, rows).lerp_(values, 1 - beta1)
        exp_avg_sq = state["exp_avg_sq"].index_select(0, rows).mul_(beta2).addcmul_(values, values, value=1 - beta2)
        state["exp_avg"].index_copy_(0, rows, exp_avg)
        state["exp_avg_sq"].index_copy_(0, rows, exp_avg_sq)
        correction1, correction2 = 1 - beta1**step, 1 - beta2**step
        step_rows = exp_avg_sq.sqrt_().div_(math.sqrt(correction2)).add_(group["eps"])  # the denominator,
        torch.div(exp_avg, step_rows, out=step_rows)  # then the step: no further rows x dim buffers
        p.index_add_(0, rows, step_rows, alpha=-float(group["lr"]) / correction1)


def ema_keep(decay: float, since: torch.Tensor, now: int) -> torch.Tensor:
    """What is left of a row's average, as a share, after the steps since+1 .. now in which
    the row sat still: the product of (1 - weight_average.ema_weight(decay, s)) over those
    steps, which telescopes to decay^(now - since) (1 - decay^since) / (1 - decay^now).
    `since`: per row, the step its average was last brought up to date (0: never)."""
    since = since.to(torch.float64)
    kept = decay ** (now - since) * (1.0 - decay**since) / (1.0 - decay**now)
    return kept


class RowAverage:
    """The weight average (train.ema's) of one table whose rows move only when a batch reads
    them, kept row by row. A row that sat still for n steps has average
    current + (average - current) * ema_keep: brought up to date just before it moves
    (`catch_up`) and for every row before the average is read (`settle`)."""

    def __init__(self, averaged: torch.Tensor, current: torch.Tensor, decay: float, step: int):
        self.averaged, self.current, self.decay = averaged, current, decay
        self.synced = torch.full((current.shape[0],), step, dtype=torch.long, device=current.device)
        self._caught: tuple = (None, None)

    def catch_up(self, rows: torch.Tensor, step: int) -> None:
        """Rows about to move in step `step`+1: their average as of step `step`, held until
        `lerp` writes it with the step's own (one write of the rows, not two)."""
        self._caught = (rows, self._brought(rows, step))

    def lerp(self, rows: torch.Tensor, weight: float, step: int) -> None:
        """Step `step`'s average of the rows that moved in it (those `catch_up` was given)."""
        held, caught = self._caught
        if held is not rows:
            raise ValueError("lerp takes the rows catch_up was given, after the step that moved them")
        self.averaged.index_copy_(0, rows, caught.lerp_(self.current.index_select(0, rows), weight))
        self.synced.index_fill_(0, rows, step)
        self._caught = (None, None)

    def settle(self, step: int) -> None:
        """Every row's average as of step `step`."""
        stale = (self.synced < step).nonzero().squeeze(1)
        if len(stale):
            self._bring(stale, step)

    def restart(self, step: int) -> None:
        """The average was set to the weights (a rollback, a resumed checkpoint): all up to date."""
        self.synced.fill_(step)

    def _bring(self, rows: torch.Tensor, step: int) -> None:
        if step > 0 and len(rows):
            self.averaged.index_copy_(0, rows, self._brought(rows, step))
            self.synced.index_fill_(0, rows, step)

    def _brought(self, rows: torch.Tensor, step: int) -> torch.Tensor:
        """The rows' averages as of step `step` (current + (average - current) * keep)."""
        averaged = self.averaged.index_select(0, rows)
        if step <= 0:
            return averaged
        keep = ema_keep(self.decay, self.synced.index_select(0, rows), step).to(averaged.dtype)[:, None]
        current = self.current.index_select(0, rows)
        return averaged.sub_(current).mul_(keep).add_(current)
