"""Pieces the training stages (LP, joint training, adding a language) share."""

from __future__ import annotations


def divergence_tags(trainer, result, stage: str) -> dict[str, str]:
    """The guard's verdict on an epoch, as tags for the stage's run (none when it did not
    fire): the first epoch that diverged, and the latest divergence with what was done."""
    if result.divergence is None:
        return {}
    first = next(r.epoch for r in [*trainer.history, result] if r.divergence)
    return {"mule.diverged": "true", "mule.diverged_epoch": str(first),
            f"mule.{stage}.divergence": f"epoch {result.epoch}: {result.divergence}",
            f"mule.{stage}.divergence_action": result.action or ""}  # fmt: skip
