"""The divergence guard's reading of an epoch: has training diverged, and why.

After an epoch whose losses are not finite, have grown far past the first batch's, or whose
validation score fell far below its best, training warns, stops, or rolls back to the best
epoch's weights with a lower learning rate (train.divergence; the trainer carries it out)."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from mule.mule_core.settings import TrainConfig

GUARD_ACTIONS = ("rollback", "stop", "warn", "off")
# A fall of fewer points than this never counts as divergence: early epochs' scores are
# small and noisy (3 -> 1 is not a collapse).
MIN_DIVERGENCE_DROP = 5.0
# An epoch whose mean total loss is this many times the first batch's (or 1.0, whichever is
# larger) has exploded, finite or not: no healthy run of these losses grows 1000-fold.
LOSS_EXPLOSION_FACTOR = 1000.0


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
