"""Which epoch training keeps, and patience: the best validation score so far, its epoch,
its weights and Adam's state (detached CPU copies), and when to stop for want of progress."""

from __future__ import annotations

import logging
import math

from mule.mule_core.progress import SHOWN
from mule.mule_core.training.average import BEST_IS_KEPT, cpu_copy
from mule.mule_core.training.records import EpochResult

log = logging.getLogger("mule.training")


class BestEpoch:
    """The kept epoch: `consider` each epoch; `without_progress` says when patience ran out."""

    def __init__(self, patience: int):
        self.patience = patience  # epochs without a better score before stopping; 0: never
        self.score = -math.inf
        self.epoch = 0
        self.state: dict | None = None  # the kept weights
        self.optimizer: dict | None = None  # Adam's state then (a rollback resumes from it)

    def consider(self, result: EpochResult, kept_model, optimizer) -> bool:
        """An epoch that did not diverge and beats the best: kept (True)."""
        if result.divergence is not None or result.score is None or result.score <= self.score:
            return False
        self.score, self.epoch = result.score, result.epoch
        # the last best's copies go before the new ones are made: one set in memory, not
        # two (on the real text each set is 1.1 GB, and a checkpoint being written holds 1.4)
        self.state = self.optimizer = None
        self.state = cpu_copy(kept_model.state_dict())
        self.optimizer = cpu_copy(optimizer.state_dict())
        return True

    def without_progress(self, epoch: int, epochs: int, score: float | None) -> str | None:
        """Why training stops after `epoch`: `patience` epochs have passed without a better
        validation score (before the epoch's checkpoint records it); None to go on."""
        if self.patience and score is not None and epoch < epochs and epoch - self.epoch >= self.patience:
            return (f"no better validation score for {epoch - self.epoch} epochs after epoch {self.epoch} "
                    f"({self.score:.2f}): patience {self.patience}")  # fmt: skip
        return None

    def state_dict(self, now: int) -> dict:
        """Right after a best epoch (most epochs while validation climbs) its copies equal the
        kept weights and the optimizer's state: named, not stored again (LP on the real text:
        4 copies of 89 M parameters a checkpoint instead of 7)."""
        kept = self.state is not None and self.epoch == now
        return {"score": self.score, "epoch": self.epoch, "state": BEST_IS_KEPT if kept else self.state,
                "optimizer": BEST_IS_KEPT if kept else self.optimizer}  # fmt: skip

    def load_state_dict(self, state: dict, kept_model, optimizer) -> None:
        """As state_dict found it; its named copies taken from the kept model and optimizer, once restored."""
        self.score, self.epoch = state["score"], state["epoch"]
        self.state, self.optimizer = state["state"], state["optimizer"]
        if isinstance(self.state, str):  # BEST_IS_KEPT: the epoch saved was the best
            self.state = cpu_copy(kept_model.state_dict())
        if isinstance(self.optimizer, str):
            self.optimizer = cpu_copy(optimizer.state_dict())


def stopped_for(reason: str, kind: str, epoch: int, epochs: int) -> None:
    log.info("%s: stopped at epoch %d of %d: %s", kind, epoch, epochs, reason, extra=SHOWN)
