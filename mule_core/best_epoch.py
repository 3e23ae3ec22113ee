"""Which epoch training keeps (mule_core/trainer.py): each epoch's verdict (the divergence
guard's reading and action, else a better validation score kept as the best epoch) and
patience, which stops training once the score stops rising."""

from __future__ import annotations

import logging

from mule.mule_core.divergence import divergence, respond
from mule.mule_core.progress import SHOWN
from mule.mule_core.training_records import EpochResult
from mule.mule_core.weight_average import cpu_copy

log = logging.getLogger("mule.training")


def close_epoch(trainer, result: EpochResult) -> None:
    """The epoch's verdict on `trainer`: diverged (and the guard's action), or the best so
    far (its weights and Adam's state copied), or neither; then it joins the history."""
    t = trainer
    result.divergence = divergence(t.train, result.losses, result.score, t.first_loss, t.best_score, t.best_epoch)
    if result.divergence is None and result.score is not None and result.score > t.best_score:
        result.is_best = True
        t.best_score, t.best_epoch = result.score, result.epoch
        # the last best's copies go before the new ones are made: one set in memory, not
        # two (on the real text each set is 1.1 GB, and a checkpoint being written holds 1.4)
        t.best_state = t.best_optimizer = None
        t.best_state = cpu_copy(t.kept_model.state_dict())
        t.best_optimizer = cpu_copy(t.optimizer.state_dict())
    t.epoch = result.epoch
    if result.divergence is not None:
        result.action = respond(t, result.epoch)
        log.warning("%s epoch %d diverged: %s; %s", t.kind, result.epoch, result.divergence, result.action)
    t.history.append(result)


def stop_without_progress(trainer, result: EpochResult) -> None:
    """train.patience (pretrain.patience for LP): stop once that many epochs have passed
    without a better validation score, before the epoch's checkpoint records it."""
    t = trainer
    if t.patience and not t.stopped and result.score is not None and t.epoch < t.epochs:
        if t.epoch - t.best_epoch >= t.patience:
            t.stopped = (f"no better validation score for {t.epoch - t.best_epoch} epochs after epoch "
                         f"{t.best_epoch} ({t.best_score:.2f}): patience {t.patience}")  # fmt: skip
            log.info("%s: stopped at epoch %d of %d: %s", t.kind, t.epoch, t.epochs, t.stopped, extra=SHOWN)
