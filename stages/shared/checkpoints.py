"""Pieces the training stages (LP, joint training, adding a language) share."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

from mule.mule_core.progress import SHOWN
from mule.stages.shared.context import StageContext, logger


def divergence_tags(trainer, result, stage: str) -> dict[str, str]:
    """The guard's verdict on an epoch, as tags for the stage's run (none when it did not
    fire): the first epoch that diverged, and the latest divergence with what was done."""
    if result.divergence is None:
        return {}
    first = next(r.epoch for r in [*trainer.history, result] if r.divergence)
    return {"mule.diverged": "true", "mule.diverged_epoch": str(first),
            f"mule.{stage}.divergence": f"epoch {result.epoch}: {result.divergence}",
            f"mule.{stage}.divergence_action": result.action or ""}  # fmt: skip


class Checkpoints:
    """A training stage's checkpoint: the trainer's whole state after every epoch, written
    atomically, resumed only by a run of the very same stage key (the same inputs, config
    and code), read without pickle (torch's weights_only loader: a checkpoint is tensors,
    numbers and strings), and removed once the stage's result is recorded."""

    def __init__(self, ctx: StageContext, path: Path):
        self.ctx, self.path = ctx, path

    def resume(self, trainer) -> None:
        state = read_checkpoint(self.path) if self.path.exists() else None
        if state is None:
            return
        if self.ctx.key and state.get("key") == self.ctx.key:
            trainer.load_state_dict(state["trainer"])
            logger().info("resuming from the checkpoint after epoch %d (%s)", trainer.epoch, self.path, extra=SHOWN)
        else:
            logger().info("ignoring a checkpoint of another setting, inputs or code (%s)", self.path, extra=SHOWN)

    def save(self, trainer) -> None:
        from mule.data_catalog.model_files import save_atomic

        save_atomic({"key": self.ctx.key, "trainer": trainer.state_dict()}, self.path)

    def remove_once_recorded(self) -> None:
        self.ctx.after_record.append(lambda: self.path.unlink(missing_ok=True))


def read_checkpoint(path: Path) -> dict | None:
    """The checkpoint, or None when it cannot be read (cut, overwritten, or holding objects
    a checkpoint never holds): training starts over."""
    import torch

    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
        if isinstance(state, dict) and "trainer" in state:
            return state
    except Exception as error:  # noqa: BLE001 - torch raises many kinds for a damaged file
        logger().warning("the checkpoint %s is unreadable (%s): training starts from epoch 1", path,
                         str(error).splitlines()[0][:120] if str(error) else type(error).__name__)  # fmt: skip
        return None
    logger().warning("the checkpoint %s is not one: training starts from epoch 1", path)
    return None


def history_records(history) -> list[dict]:
    """A trainer's epochs as plain records: part of a stage's summary, drawn by its publisher."""
    return [asdict(epoch) for epoch in history]


def phase_seconds(history) -> dict[str, float]:
    """Where a training's time went, summed over its epochs (batches, forward, backward,
    optimizer, validation): part of a stage's summary, so bench/stage_times.py can print it."""
    totals: dict[str, float] = {}
    for epoch in history:
        for phase, seconds in (epoch.phases or {}).items():
            totals[phase] = round(totals.get(phase, 0.0) + seconds, 2)
    return totals
