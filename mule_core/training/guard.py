"""The divergence guard: has training diverged, and what to do about it.

After an epoch whose losses are not finite, have grown far past the first batch's, or whose
validation score fell far below its best, training warns, stops, or rolls back to the best
epoch's weights with a lower learning rate (train.divergence): `DivergenceGuard.reading`
reads the epoch, `respond` carries out the action on the trainer."""

from __future__ import annotations

import logging
import math
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from mule.mule_core.settings import TrainConfig

log = logging.getLogger("mule.training")
GUARD_ACTIONS = ("rollback", "stop", "warn", "off")
# A fall of fewer points than this never counts as divergence: early epochs' scores are
# small and noisy (3 -> 1 is not a collapse).
MIN_DIVERGENCE_DROP = 5.0
# An epoch whose mean total loss is this many times the first batch's (or 1.0, whichever is
# larger) has exploded, finite or not: no healthy run of these losses grows 1000-fold.
LOSS_EXPLOSION_FACTOR = 1000.0


class DivergenceGuard:
    """train.divergence: reads each epoch (`reading`) and acts on a diverged one (`respond`);
    its state is the total loss of training's first batch (what "exploded" is measured
    against) and the rollbacks made."""

    def __init__(self, train: TrainConfig):
        self.train = train
        self.first_loss: float | None = None
        self.rollbacks = 0

    def reading(self, losses: dict[str, float], score: float | None, best_score: float, best_epoch: int) -> str | None:
        """Why this epoch diverged (one line), or None: `losses` are its mean losses, `score`
        its validation score."""
        return divergence(self.train, losses, score, self.first_loss, best_score, best_epoch)

    def respond(self, trainer, epoch: int) -> str:
        """train.divergence's action on `trainer` after a diverged epoch, in words: warn; roll
        back to the best epoch (or the starting weights) at a lower learning rate,
        train.divergence_retries times at most; else stop, keeping the best epoch."""
        train, mode, best, updates = self.train, self.train.divergence, trainer.best, trainer.updates
        if mode == "warn":
            return "warned only (divergence=warn)"
        if mode == "rollback" and self.rollbacks < train.divergence_retries:
            self.rollbacks += 1
            if best.state is not None:
                updates.load_weights(best.state)
                updates.optimizer.load_state_dict(best.optimizer)
                where = f"epoch {best.epoch}"
            else:
                updates.load_weights(trainer.start_state)
                updates.optimizer.state.clear()  # Adam's moments from diverged steps would carry it away again
                where = "the starting weights"
            updates.lower_lr(train.divergence_lr_factor)
            return (f"rolled back to {where}, learning rate x{updates.lr_scale:g} "
                    f"(rollback {self.rollbacks} of {train.divergence_retries})")  # fmt: skip
        reason = "divergence=stop" if mode == "stop" else f"{self.rollbacks} rollbacks did not help"
        trainer.stopped = f"diverged at epoch {epoch} ({reason})"
        if best.state is None:  # no good epoch: what training started from beats diverged weights
            updates.load_weights(trainer.start_state)
            return f"stopped ({reason}); no epoch was good, the starting weights are kept"
        return f"stopped ({reason}); the best epoch is kept"

    def state_dict(self) -> dict:
        return {"first_loss": self.first_loss, "rollbacks": self.rollbacks}

    def load_state_dict(self, state: dict) -> None:
        self.first_loss, self.rollbacks = state.get("first_loss"), state.get("rollbacks", 0)


def divergence(train: TrainConfig, losses: dict[str, float], score: float | None, first_loss: float | None,
               best_score: float, best_epoch: int) -> str | None:  # fmt: skip
    """Why this epoch diverged (one line), or None: `losses` are its mean losses, `score` its
    validation score, `first_loss` the total loss of training's first batch."""
    if train.divergence == "off":
        return None
    bad = {k: v for k, v in losses.items() if not math.isfinite(v)}
    if bad:
        return "losses not finite (" + ", ".join(f"{k} {v}" for k, v in bad.items()) + ")"
    total = losses.get("total")
    if total is not None and first_loss is not None and total > LOSS_EXPLOSION_FACTOR * max(first_loss, 1.0):
        return f"losses exploded (total {total:.4g}, from {first_loss:.4g} at the first batch)"
    if score is None or not math.isfinite(best_score):
        return None
    if not math.isfinite(score):
        return f"validation score {score}"
    floor = best_score * train.divergence_drop
    if score < floor and best_score - score >= MIN_DIVERGENCE_DROP:
        return (f"validation score {score:.2f} fell below {train.divergence_drop:.0%} of its best, "
                f"{best_score:.2f} at epoch {best_epoch}")  # fmt: skip
    return None
