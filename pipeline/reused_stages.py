"""A stage whose key is unchanged: its MLflow run says it was reused, and a result that
the run which computed it stopped before publishing is published here. Apart from
pipeline.decisions (which decides, and imports no publisher) so that deciding and publishing
import each other nowhere."""

from __future__ import annotations

from mule.config.sections import MuleConfig
from mule.experiments import tracking
from mule.pipeline import decisions
from mule.pipeline.decisions import Decision
from mule.storage.workdir import Workdir


def reuse_stage(wd: Workdir, cfg: MuleConfig, decision: Decision, parent_run_id: str | None) -> dict:
    """A stage whose key is unchanged: no work, an MLflow run that says so (and points at the
    run that produced what is reused), and the result that run recorded. If that run
    stopped before publishing it, this run publishes it (the figures, the logged and
    registered model: once, see experiments.registry) and says so."""
    result = decisions.reused_result(decision, wd)
    with tracking.run(wd, cfg, decision.stage, parent_run_id) as run_id:
        tracking.Tracker(wd, run_id).tags(decisions.tags(decision))
        if decisions.publish_pending(decision):
            from mule.pipeline.publish import publish

            decisions.logger().warning("%s: reused (key %s); the run that computed it (MLflow %s) stopped before "
                                   "publishing it: publishing it now", decision.stage, decision.key[:12],
                                   decision.record.get("run_id"))  # fmt: skip
            result = result | publish(decision.stage, wd, cfg, result, run_id)
            tracking.Tracker(wd, run_id).tags({"mule.published_here": f"for run {decision.record.get('run_id')}, "
                                                                      "which stopped before publishing"})  # fmt: skip
            decisions.mark_published(wd, cfg, decision, {k: v for k, v in result.items()
                                                     if k not in ("reused", "stage_key", "reused_from_run")}, run_id)  # fmt: skip
    decisions.logger().info("%s: %s, from MLflow run %s", decision.stage, decision.describe(), decision.record.get("run_id"))
    return result
