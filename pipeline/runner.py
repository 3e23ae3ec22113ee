"""Running one decided stage: its MLflow run, its computation, its publication, its record.

    runner = Runner(workdir)                      # or with Prefect's task around each computation
    result = runner.run(cfg, "train", parent_run_id)

`run` decides (pipeline.decisions) and either reuses the stage (an MLflow run that says so,
and the result it recorded) or runs it: computes (tasks.*: the catalog in, the catalog
out, a summary back), publishes (pipeline.publish: figures, MLflow, the registry), then
records the key, the outputs' digests and the summary. The rebuild's stages and the
sweeps' steps all run here, so there is one way a stage runs and one way it is reused.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from mule.config.sections import MuleConfig
from mule.config.stage_view import declared_sections
from mule.pipeline import decisions, reused_stages
from mule.pipeline.declaration import BY_NAME, Stage
from mule.storage.locks import end_commit
from mule.storage.workdir import Workdir

# (stage) -> the function that computes it; Prefect's flows wrap it in a task
Computes = Callable[[Stage], Callable[[Any], dict]]
# (workdir, config, decision, parent run id) -> the recorded result of a reused stage
Reuses = Callable[[Workdir, MuleConfig, decisions.Decision, str | None], dict]


def _load(stage: Stage) -> Callable[[Any], dict]:
    return stage.load_task()


def prepare(wd: Workdir, cfg: MuleConfig, name: str, act: bool = True) -> bool:
    """The stage's preparation (a generated dataset, the extractor's weights) when `act`;
    otherwise only whether it has nothing to do."""
    prepare = BY_NAME[name].load_prepare()
    return prepare is None or bool(prepare(wd, cfg, generate=act))


@dataclass
class Runner:
    workdir: Workdir
    computes: Computes = _load
    reuses: Reuses = reused_stages.reuse_stage
    report: Any = field(default=None)  # a reporter for stages run without MLflow (tests); None: MLflow's

    def decide(self, cfg: MuleConfig, name: str, force: bool = False) -> decisions.Decision:
        prepare(self.workdir, cfg, name)
        return decisions.decide(self.workdir, cfg, name, force)

    def run(self, cfg: MuleConfig, name: str, parent_run_id: str | None = None, force: bool = False,
            decision: decisions.Decision | None = None, track: bool = True) -> dict:  # fmt: skip
        """Stage `name` under `cfg`: reused when its key is unchanged, else run. `decision`:
        one already taken (by the rebuild); `track=False`: no MLflow run (tests, benches)."""
        decision = decision or self.decide(cfg, name, force)
        if not decision.run:
            if not track:
                return decisions.reused_result(decision, self.workdir)
            return self.reuses(self.workdir, cfg, decision, parent_run_id)
        if not track:
            return self._execute(cfg, decision, None)
        from mule.experiments import tracking

        with tracking.run(self.workdir, cfg, name, parent_run_id) as run_id:
            return self._execute(cfg, decision, run_id)

    def _execute(self, cfg: MuleConfig, decision: decisions.Decision, run_id: str | None) -> dict:
        from mule.experiments.tracking import Tracker
        from mule.stages.shared.context import Silent, StageContext

        stage = BY_NAME[decision.stage]
        report = Tracker(self.workdir, run_id) if run_id else (self.report or Silent())
        report.tags(decisions.tags(decision) | {f"mule.{k}": str(v) for k, v in decisions.runtime_record(cfg, stage).items()})
        decisions.logger().info("%s: %s", stage.name, decision.describe())
        # the computation is handed only the sections its declaration names (the rest fail loudly)
        ctx = StageContext(self.workdir, declared_sections(cfg, stage.name, stage.sections), key=decision.key,
                           force=decision.forced, report=report)  # fmt: skip
        started = time.perf_counter()
        decisions.mark_running(self.workdir, cfg, decision)  # a stop before the record: the next run says so
        try:
            result = self.computes(stage)(ctx)
            # Recorded before publishing: a stop or an MLflow error while publishing (seconds,
            # for a registered model) keeps the work; the next run publishes it (reused_stages.reuse_stage).
            decisions.record(self.workdir, cfg, decision, result, run_id, time.perf_counter() - started)
        finally:
            end_commit(self.workdir)  # readers (mule serve, search) may read what it wrote
        for cleanup in ctx.after_record:  # what only a recorded result may let go (a checkpoint)
            cleanup()
        from mule.pipeline.publish import publish  # MLflow, figures: imported when something is published

        started = time.perf_counter()
        result = result | publish(stage.name, self.workdir, cfg, result, run_id)
        if run_id or not stage.publish:  # without MLflow (track=False) the rest stays to publish
            decisions.mark_published(self.workdir, cfg, decision, result, run_id, time.perf_counter() - started)
        return result


def run_alone(wd: Workdir, cfg: MuleConfig, name: str, force: bool = True, report=None) -> dict:
    """A stage computed here and now (forced by default), published to the workdir only and
    recorded: what tests and bench scripts call instead of a Prefect flow."""
    return Runner(wd, report=report).run(cfg, name, force=force, track=False)
