"""A Trainer's checkpoint (mule_core/trainer.py): everything an interrupted run needs to go
on as if never stopped: the weights and their average, Adam's state, the schedules' step,
AMP's scale, the best epoch so far, the divergence guard's rollbacks and the history."""

from __future__ import annotations

from mule.mule_core.training_records import EpochResult
from mule.mule_core.weight_average import BEST_IS_KEPT, cpu_copy


def trainer_state(trainer) -> dict:
    """The trainer's state as a dict of tensors and plain values (torch.save writes it)."""
    # Right after a best epoch (most epochs while validation climbs) its copies equal
    # the kept weights and the optimizer's state: named, not stored again (LP on the
    # real text: 4 copies of 89 M parameters a checkpoint instead of 7)
    t, updates = trainer, trainer.updates
    best_is_now = t.best_state is not None and t.best_epoch == t.epoch
    return {
        "model": t.model.state_dict(),
        "optimizer": updates.optimizer.state_dict(),
        "scheduler": updates.scheduler.state_dict(),
        "scaler": updates.scaler.state_dict(),
        "epoch": t.epoch,
        "best_score": t.best_score,
        "best_epoch": t.best_epoch,
        "best_state": BEST_IS_KEPT if best_is_now else t.best_state,
        "best_optimizer": BEST_IS_KEPT if best_is_now else t.best_optimizer,
        "lr_scale": updates.lr_scale,
        "rollbacks": t.rollbacks,
        "stopped": t.stopped,
        "first_loss": t.first_loss,
        "history": [vars(r) for r in t.history],
        "ema": updates.average.model.state_dict() if updates.average is not None else None,
    }


def restore_trainer(trainer, state: dict) -> None:
    """The trainer as `trainer_state` found it."""
    t, updates = trainer, trainer.updates
    t.model.load_state_dict(state["model"])
    updates.optimizer.load_state_dict(state["optimizer"])
    updates.lr_scale, t.rollbacks = state.get("lr_scale", 1.0), state.get("rollbacks", 0)
    t.stopped, t.best_optimizer = state.get("stopped"), state.get("best_optimizer")
    t.first_loss = state.get("first_loss")
    updates.scheduler.load_state_dict(state["scheduler"])
    if state.get("scaler"):
        updates.scaler.load_state_dict(state["scaler"])
    t.epoch = state["epoch"]
    t.best_score, t.best_epoch, t.best_state = state["best_score"], state["best_epoch"], state["best_state"]
    t.history = [EpochResult(**r) for r in state["history"]]
    if updates.average is not None:
        updates.average.model.load_state_dict(state.get("ema") or state["model"])
        updates.average.restart(updates.step)  # checkpoints hold settled averages
    if isinstance(t.best_state, str):  # BEST_IS_KEPT: the epoch saved was the best
        t.best_state = cpu_copy(updates.kept_model.state_dict())
    if isinstance(t.best_optimizer, str):
        t.best_optimizer = cpu_copy(updates.optimizer.state_dict())
