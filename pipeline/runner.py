"""Running one stage: decided once, then reused or computed and recorded, with hooks around it.

    result = Runner(workdir, hooks=tracked()).run(cfg, "train", parent_run_id)

`run` takes the stage's decision (pipeline.decisions; one the caller already took, or
takes it now) and either reuses the stage (the result its record holds) or computes it
(tasks.*: the catalog in, the catalog out, a summary back) and records the key, the
outputs' digests and the summary. Everything else (MLflow, publishing, Prefect's task
around the computation, timing lines) is a hook (pipeline.hooks) the caller hands in.
The rebuild's stages and the sweeps' steps all run here: one way a stage runs and one
way it is reused.
"""

from __future__ import annotations

import resource
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from mule.config.sections import MuleConfig
from mule.config.stage_view import declared_sections
from mule.pipeline import decisions
from mule.pipeline.declaration import BY_NAME
from mule.pipeline.hooks import Hook, Publishing, StageRun, Timing, check_hooks
from mule.storage.locks import end_commit, holds_lock, workdir_lock
from mule.storage.workdir import Workdir
from mule.tasks.shared.context import Silent, StageContext


def cpu_time() -> float:
    """CPU-seconds so far: this process's threads and the child processes it waited for (the
    text stage's fastText runs in processes of its own; a worker pool kept across stages is
    counted when it ends)."""
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.process_time() + children.ru_utime + children.ru_stime


def prepare(wd: Workdir, cfg: MuleConfig, name: str, act: bool = True) -> bool:
    """The stage's preparation (a generated dataset, the extractor's weights) when `act`;
    otherwise only whether it has nothing to do."""
    prepare = BY_NAME[name].load_prepare()
    return prepare is None or bool(prepare(wd, cfg, generate=act))


@dataclass
class Runner:
    workdir: Workdir
    hooks: Sequence[Hook] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.hooks = check_hooks(self.hooks)

    def decide(self, cfg: MuleConfig, name: str, force: bool = False) -> decisions.Decision:
        prepare(self.workdir, cfg, name)
        return decisions.decide(self.workdir, cfg, name, force)

    def run(self, cfg: MuleConfig, name: str, parent_run_id: str | None = None, force: bool = False,
            decision: decisions.Decision | None = None) -> dict:  # fmt: skip
        """Stage `name` under `cfg`: reused when its key is unchanged, else computed.
        `decision`: one already taken (by the rebuild's plan), not taken again."""
        run = StageRun(self.workdir, cfg, BY_NAME[name], decision or self.decide(cfg, name, force), parent_run_id)
        with run.exits:
            if not run.decision.run:
                run.result = decisions.reused_result(run.decision, self.workdir)
                self._call("on_stage_reused", run)
                return run.result
            if holds_lock(self.workdir):  # the lock names the stage in hand: who waits, and a stop, say which
                run.exits.enter_context(workdir_lock(self.workdir, name))
            try:
                self._call("before_stage_run", run)
                self._compute(run)
            except BaseException as error:
                self._call("on_stage_error", run, error)
                raise
            self._call("after_stage_run", run)
            return run.result

    def _compute(self, run: StageRun) -> None:
        stage, decision = run.stage, run.decision
        # it is handed only the config sections and catalog entries its declaration names (the rest fail loudly)
        ctx = StageContext(self.workdir, declared_sections(run.cfg, stage.name, stage.sections), key=decision.key,
                           force=decision.forced, report=run.report or Silent(), stage=stage.name,
                           entries=frozenset(stage.entries_read(run.cfg)) | frozenset(stage.writes))  # fmt: skip
        compute: Callable[[StageContext], dict] = stage.load_task()
        for hook in self.hooks:
            compute = hook.around_compute(run, compute)
        started, cpu_started = time.perf_counter(), cpu_time()
        decisions.mark_running(self.workdir, run.cfg, decision)  # a stop before the record: the next run says so
        try:
            run.result = compute(ctx)
            run.seconds, run.cpu_seconds = time.perf_counter() - started, cpu_time() - cpu_started
            # Recorded before any hook publishes: a stop or an MLflow error while publishing
            # (seconds, for a registered model) keeps the work; the next run publishes it.
            decisions.record(self.workdir, run.cfg, decision, run.result, run.run_id, run.seconds, run.cpu_seconds)
        finally:
            end_commit(self.workdir)  # readers (mule serve, search) may read what it wrote
        for cleanup in ctx.after_record:  # what only a recorded result may let go (a checkpoint)
            cleanup()

    def _call(self, point: str, run: StageRun, *args) -> None:
        for hook in self.hooks:
            getattr(hook, point)(run, *args)


def untracked(report=None) -> list:
    """The hooks of a run without MLflow (tests, benches): published to the workdir only
    (what needs MLflow stays marked unpublished), live metrics to `report`."""
    from mule.pipeline.hooks import LiveReport

    return [LiveReport(report or Silent()), Publishing(), Timing()]


def run_alone(wd: Workdir, cfg: MuleConfig, name: str, force: bool = True, report=None) -> dict:
    """A stage computed here and now (forced by default), published to the workdir only and
    recorded: what tests and bench scripts call instead of a Prefect flow."""
    return Runner(wd, hooks=untracked(report)).run(cfg, name, force=force)
