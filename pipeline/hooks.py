"""What happens around a stage, in the shape Kedro gives it: hooks the runner calls at
fixed points, in the order they are given. The runner knows none of them by name; the
one who runs stages picks them:

    Runner(workdir)                                            # computes and records, nothing else
    Runner(workdir, hooks=tracked())                           # MLflow, publishing, timing
    Runner(workdir, hooks=[*tracked(), PrefectTasks()])        # and each computation a Prefect task (flows/)

A hook is a `Hook`: it overrides any of these (Kedro's before/after_pipeline_run,
before/after_node_run and on_node_error; around_compute and on_stage_reused are mule's).
`check_hooks` refuses a hook with a method of another name (a misspelt point would never
be called), and the runner calls it on the hooks it is handed:

    before_pipeline_run(whole)       a run of several stages starts (the rebuild's MLflow run)
    after_pipeline_run(whole)        every stage done (the run's tables and recalls published)
    before_stage_run(run)            the stage will compute: its MLflow run opens here
    around_compute(run, compute)     -> the computation as it will be called (Prefect's task)
    after_stage_run(run)             computed and recorded: publish, log
    on_stage_error(run, error)       the computation or a hook before it raised
    on_stage_reused(run)             the key was unchanged: nothing computed

`run` is a StageRun: what is known about this stage's run (its config, decision, MLflow
run id once a hook opened one, the result once computed). A hook that must close
something whatever happens enters it on `run.exits`, which the runner closes last, with
the exception if one is raised (MLflow's run ends FAILED or KILLED then).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field
from typing import Any

from mule.config.sections import MuleConfig
from mule.mule_core.progress import SHOWN
from mule.pipeline import decisions
from mule.pipeline.declaration import Stage
from mule.storage.workdir import Workdir


class Hook:
    """The points a hook may act at, each doing nothing until a hook overrides it."""

    def before_pipeline_run(self, whole) -> None: ...
    def after_pipeline_run(self, whole) -> None: ...
    def before_stage_run(self, run: StageRun) -> None: ...
    def around_compute(self, run: StageRun, compute: Callable) -> Callable:
        return compute
    def after_stage_run(self, run: StageRun) -> None: ...
    def on_stage_error(self, run: StageRun, error: BaseException) -> None: ...
    def on_stage_reused(self, run: StageRun) -> None: ...


POINTS = frozenset(name for name in vars(Hook) if not name.startswith("_"))


def check_hooks(hooks: Sequence[Any]) -> list[Hook]:
    """`hooks` as given, once each is a Hook whose public methods are all points: a
    method named otherwise (`after_stage_runs`) is an error here, not a hook never called."""
    for hook in hooks:
        if not isinstance(hook, Hook):
            raise TypeError(f"{type(hook).__name__} is not a mule.pipeline.hooks.Hook")
        strays = sorted(name for name in dir(type(hook)) if not name.startswith("_") and name not in POINTS
                        and callable(getattr(type(hook), name)))  # fmt: skip
        if strays:
            raise TypeError(f"{type(hook).__name__} has {', '.join(strays)}, which is no hook point; "
                            f"the points are {', '.join(sorted(POINTS))}")  # fmt: skip
    return list(hooks)


@dataclass
class StageRun:
    workdir: Workdir
    cfg: MuleConfig
    stage: Stage
    decision: decisions.Decision
    parent_run_id: str | None = None
    run_id: str | None = None  # the stage's MLflow run, once a hook opened one
    report: Any = None  # where live metrics go (MLflow's Tracker); None: nowhere
    result: dict | None = None
    seconds: float = 0.0  # the computation's, once it returned
    cpu_seconds: float = 0.0  # CPU time over the computation: this process's threads and the children it waited for
    exits: ExitStack = field(default_factory=ExitStack)


class MlflowTracking(Hook):
    """A run of several stages is an MLflow run, and each stage a run under it (or under
    the sweep's): its params, the tags that say why it ran or was reused, live metrics
    while it computes."""

    def before_pipeline_run(self, whole) -> None:
        from mule.experiments import tracking

        whole.run_id = whole.exits.enter_context(tracking.run(whole.workdir, whole.cfg, whole.plan.name))

    def before_stage_run(self, run: StageRun) -> None:
        from mule.experiments import tracking

        run.run_id = run.exits.enter_context(tracking.run(run.workdir, run.cfg, run.stage.name, run.parent_run_id))
        run.report = tracking.Tracker(run.workdir, run.run_id)
        runtime = {f"mule.{k}": str(v) for k, v in decisions.runtime_record(run.cfg, run.stage).items()}
        run.report.tags(decisions.tags(run.decision) | runtime)

    def on_stage_reused(self, run: StageRun) -> None:
        from mule.experiments import tracking

        run.run_id = run.exits.enter_context(tracking.run(run.workdir, run.cfg, run.stage.name, run.parent_run_id))
        run.report = tracking.Tracker(run.workdir, run.run_id)
        run.report.tags(decisions.tags(run.decision))


class Publishing(Hook):
    """After a stage computed: its figures, reports, MLflow metrics and artifacts, and for
    the train stage the registered model (pipeline.publish). A result whose run stopped
    before publishing it is published first, into the run that computed it, whether the
    stage is reused now or is about to compute again under another key (and so overwrite
    it). Without MLflow (no run id) a stage that has something to publish stays marked
    unpublished: the next tracked run publishes it."""

    def after_pipeline_run(self, whole) -> None:
        """The run's own MLflow run: each stage's decision, the test recalls, the tables."""
        from mule.pipeline.publish import publish_rebuild

        publish_rebuild(whole.workdir, whole.cfg, whole.results, whole.described, whole.run_id)

    def before_stage_run(self, run: StageRun) -> None:
        if decisions.publish_pending(run.decision):  # what would be overwritten is published first
            _publish_pending(run, replaced=True)

    def after_stage_run(self, run: StageRun) -> None:
        from mule.pipeline.publish import publish

        started = time.perf_counter()
        run.result = run.result | publish(run.stage.name, run.workdir, run.cfg, run.result, run.run_id)
        if run.run_id or not run.stage.publish:
            decisions.mark_published(run.workdir, run.cfg, run.decision, run.result, run.run_id,
                                     time.perf_counter() - started)  # fmt: skip

    def on_stage_reused(self, run: StageRun) -> None:
        if decisions.publish_pending(run.decision):
            published = _publish_pending(run, replaced=False)
            if published is not None:
                run.result = run.result | published
        elif run.run_id and run.stage.name in REGISTERED:
            _publish_lost(run)


# the stages whose models are registered: a reuse publishes again a model the registry cannot load
REGISTERED = ("train", "extend")


def _publish_lost(run: StageRun) -> None:
    """A reused model whose registered versions cannot be loaded any more (their runs' files
    removed: `mlflow gc`, a hand in the store) is published again from the workdir, into this
    run: a new version, the champion in a lost one's place."""
    from mule.experiments import registry
    from mule.pipeline.publish import publish

    record = run.decision.record or {}
    why = registry.lost(run.workdir, run.cfg.data.dataset, registry.model_identity(record))
    if not why:
        return
    logger().warning("%s: the registered model cannot be loaded (%s): publishing it again from %s", run.stage.name,
                     why, (record.get("result") or {}).get("path", "the workdir"), extra=SHOWN)  # fmt: skip
    result = {k: v for k, v in decisions.reused_result(run.decision, run.workdir).items()
              if k not in ("reused", "stage_key", "reused_from_run")}  # fmt: skip
    run.result = run.result | publish(run.stage.name, run.workdir, run.cfg, result, run.run_id)


def _publish_pending(run: StageRun, replaced: bool) -> dict | None:
    """Publishes the result a stopped run computed and recorded but never published: into
    that run when it is still in the store (it then ends FINISHED), else into this stage's
    run, or, when this stage computes again next (`replaced`: its outputs are overwritten),
    into a run of its own. Returns what the publisher added, or None when nothing could be
    published (said in one line)."""
    from mule.experiments import tracking
    from mule.pipeline.publish import publish

    wd, decision, record = run.workdir, run.decision, run.decision.record
    stopped = record.get("run_id")
    if replaced and stopped is None:
        return None  # computed without MLflow (a test, a bench script): no run stopped, nothing to finish
    alive = tracking.run_alive(wd, stopped)
    if not alive and run.run_id is None:
        return None  # no MLflow here: the next tracked run publishes it
    what = f"{decision.stage}: MLflow run {stopped} (key {record['key'][:12]}) computed a result"
    changed = decisions.pending_changed(wd, decision)
    if changed:
        logger().warning("%s and stopped before publishing it; it cannot be published now (%s)%s", what, changed,
                         ": this run replaces it" if replaced else "", extra=SHOWN)  # fmt: skip
        return None
    logger().warning("%s and stopped before publishing it: publishing it %s", what,
                     "before this run replaces it" if replaced else "now", extra=SHOWN)  # fmt: skip
    cfg = decisions.recorded_config(run.cfg, record)
    result = {k: v for k, v in decisions.reused_result(decision, wd).items()
              if k not in ("reused", "stage_key", "reused_from_run")}  # fmt: skip
    with ExitStack() as own:
        if alive:
            target = stopped
        elif replaced:  # never into the run that computes the next result: one model.pt per run
            target = own.enter_context(tracking.run(wd, cfg, decision.stage, run.parent_run_id,
                                                    tags={"mule.published_for": f"run {stopped}, deleted"}))  # fmt: skip
        else:
            target = run.run_id
        added = publish(decision.stage, wd, cfg, result, target)
        decisions.mark_published(wd, run.cfg, decision, result | added, target, key=record["key"])
    if alive:
        tracking.finish_stopped_run(wd, stopped, run.run_id)
    if run.report is not None and target != run.run_id:
        run.report.tags({"mule.published_for": f"run {stopped}, which stopped before publishing"})
    return added


class Timing(Hook):
    """One line per stage: what it did and how long it took."""

    def before_stage_run(self, run: StageRun) -> None:
        decisions.logger().info("%s: %s", run.stage.name, run.decision.describe(), extra=SHOWN)

    def after_stage_run(self, run: StageRun) -> None:
        decisions.logger().info("%s: computed in %.1f s (%.0f CPU-s)", run.stage.name, run.seconds, run.cpu_seconds,
                                extra=SHOWN)  # fmt: skip

    def on_stage_reused(self, run: StageRun) -> None:
        decisions.logger().info("%s: %s", run.stage.name, run.decision.describe(), extra=SHOWN)
        decisions.logger().info("%s: reused from MLflow run %s", run.stage.name, run.decision.record.get("run_id"))


class LiveReport(Hook):
    """Live metrics to a reporter of one's own (tests, benches), where no MLflow run is."""

    def __init__(self, report) -> None:
        self.report = report

    def before_stage_run(self, run: StageRun) -> None:
        run.report = run.report or self.report


def tracked() -> list:
    """The hooks of a tracked run: MLflow first (publishing logs into its run), then publishing, then timing."""
    return [MlflowTracking(), Publishing(), Timing()]


def logger() -> logging.Logger:
    return logging.getLogger("mule.pipeline")
