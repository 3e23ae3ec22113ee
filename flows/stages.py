"""The Prefect flows: `rebuild`, one per stage of the rebuild declared in
pipeline.declaration, and one per sweep (ablation, add-language): what deployments run.

Flows only wire: a flow takes the workdir's lock, resolves the config once (from a
preset and overrides, or the command's MuleConfig as it is) and hands the
stages to the rebuild's body (pipeline.rebuild) or the one runner (pipeline.runner) with
the hooks of a tracked run and PrefectTasks, which makes each stage's computation a task
run of the flow. Stages talk only through the catalog and the workdir, so each stage's
flow runs alone: rerun `train` after changing a loss weight, or `features` after adding
images. Every flow takes workdir, preset and overrides (dotted config options); `rebuild`
also the config and the plan a command already made (each stage is decided once). A
stage's computing module is imported when the stage runs: a rebuild that reuses
everything never imports torch's training code.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from functools import partial
from typing import Any

from prefect import flow, task, unmapped
from prefect.cache_policies import NO_CACHE
from prefect.states import Failed

from mule.config.resolution import resolve
from mule.config.sections import MuleConfig
from mule.flows.dask_runner import dask_task_runner
from mule.flows.environment import yield_to_serving
from mule.flows.prefect_logs import quiet_user_errors
from mule.mule_core.errors import is_user_error
from mule.mule_core.settings import ConfigError
from mule.pipeline import rebuild
from mule.pipeline.declaration import ALL, STAGES, Stage, checked_stages
from mule.pipeline.hooks import Hook, tracked
from mule.pipeline.runner import Runner
from mule.pipeline.sweeps import run_sweep
from mule.storage.locks import holds_lock, workdir_lock
from mule.storage.workdir import Workdir


def _workdir(workdir: str | None) -> Workdir:
    """The workdir parameter; None means $MULE_HOME or ./mule-work. A deployment made
    without MULE_HOME carries "" or its unresolved placeholder: that is an error, not a
    reason to write wherever the worker happens to run."""
    if workdir is not None and (not str(workdir).strip() or "{{" in str(workdir)):
        raise ConfigError(
            f"the workdir parameter is {workdir!r}: this deployment was made without MULE_HOME set. "
            "Redeploy with `MULE_HOME=/path/to/workdir prefect deploy --all`, or run it with "
            "`--param workdir=/path/to/workdir`."
        )
    return Workdir.at(workdir)


@contextmanager
def _working(workdir: str | None, preset: str | None, overrides: dict[str, Any] | None, stage: str,
             config: MuleConfig | None = None) -> Iterator[tuple[Workdir, MuleConfig]]:  # fmt: skip
    """The workdir, under its lock (one mule process at a time), its stored paths pointed
    at itself if it was copied or moved, and the config: handed down already resolved (by
    the command, in this process: used as it is), or resolved here from a deployment's
    preset and overrides."""
    from mule.experiments import relocation

    wd = _workdir(workdir)
    cfg = config if config is not None else resolve(preset, overrides)
    nested = holds_lock(wd)
    with workdir_lock(wd, stage):
        if not nested:
            relocation.adopt(wd)
        yield wd, cfg


def _failing_quietly(body):
    """Runs body(); a user error ends the flow run Failed with exactly its message (and no
    traceback in the log: flows.prefect_logs.quiet_user_errors), then reaches the caller."""
    from mule.flows import open_runs

    quiet_user_errors()
    try:
        yield_to_serving()
        return open_runs.inside(body)
    except Exception as error:
        from mule.stopping.interrupts import Interrupted, stopping

        if (
            signum := stopping()
        ) is not None:  # e.g. Prefect failing to mark a task run crashed that it had not yet made
            raise Interrupted(signum) from error
        if is_user_error(error):
            return Failed(message=str(error), data=error)
        raise


def _features_on_dask(ctx) -> dict:
    """The features stage with features.runner=dask: its shards mapped over Dask workers."""
    from dataclasses import asdict

    from mule.tasks.features import compute, extract_shard, finish_features, plan_features

    if ctx.cfg.features.runner != "dask":
        return compute(ctx)
    plan = plan_features(ctx)
    if not plan["shards"]:
        return finish_features(ctx, plan, [])
    runner = dask_task_runner(ctx.cfg.features, len(plan["shards"]))
    shard_task = task(name="extract-shard", cache_policy=NO_CACHE)(extract_shard)
    root, features, dataset = str(ctx.workdir.root), asdict(ctx.cfg.features), ctx.dataset

    @flow(name="features-shards", task_runner=runner)
    def shards_flow() -> list[dict]:
        futures = shard_task.map(unmapped(root), unmapped(features), unmapped(dataset), unmapped(plan["extractor"]),
                                 plan["shards"], unmapped(plan["todo"]))  # fmt: skip
        return [future.result() for future in futures]

    return finish_features(ctx, plan, shards_flow())


class PrefectTasks(Hook):
    """A hook (pipeline.hooks): each stage's computation a Prefect task run of the flow
    that runs it (the rebuild's, a stage's, a sweep's); the features stage with
    features.runner=dask, its own flow of shards on a Dask cluster."""

    def around_compute(self, run, compute):
        work = _features_on_dask if run.stage.name == "features" else compute
        return task(name=run.stage.name, cache_policy=NO_CACHE)(work)


def hooks() -> list:
    """What a flow runs its stages with: MLflow, publishing, timing, and Prefect's tasks."""
    return [*tracked(), PrefectTasks()]


def run_stage(stage: Stage, workdir: str | None, preset: str | None, overrides: dict[str, Any] | None,
              parent_run_id: str | None, force: bool = False, config: MuleConfig | None = None) -> dict:  # fmt: skip
    """One stage under the workdir's lock, run only when its key changed (pipeline.decisions)
    or when forced."""
    with _working(workdir, preset, overrides, stage.name, config) as (wd, cfg):
        return Runner(wd, hooks()).run(cfg, stage.name, parent_run_id, force)


def _stage_flow(stage: Stage):
    """The Prefect flow of a content-addressed stage (they differ only in their declaration)."""

    def stage_flow(workdir: str | None = None, preset: str | None = None, overrides: dict[str, Any] | None = None,
                   parent_run_id: str | None = None, force: bool = False,
                   config: MuleConfig | None = None) -> dict:  # fmt: skip
        return _failing_quietly(lambda: run_stage(stage, workdir, preset, overrides, parent_run_id, force, config))

    stage_flow.__name__ = stage_flow.__qualname__ = f"{stage.name.replace('-', '_')}_flow"
    stage_flow.__doc__ = stage.summary
    return flow(name=stage.name, description=stage.summary)(stage_flow)


STAGE_FLOWS: dict[str, Any] = {s.name: _stage_flow(s) for s in STAGES if s.kind == "rebuild"}
# Module attributes for prefect.yaml's entrypoints (flows/stages.py:train_flow, ...).
globals().update({f.fn.__name__: f for f in STAGE_FLOWS.values()})


def _sweep_flow(stage: Stage):
    """The Prefect flow of a sweep: its variants' steps as tasks of one flow run. The stages
    it needs first run before it in the rebuild (`mule run ablation` runs them)."""

    def sweep_flow(workdir: str | None = None, preset: str | None = None, overrides: dict[str, Any] | None = None,
                   parent_run_id: str | None = None, config: MuleConfig | None = None) -> dict:  # fmt: skip
        def body() -> dict:
            with _working(workdir, preset, overrides, stage.name, config) as (wd, cfg):
                return run_sweep(stage.name, Runner(wd, hooks()), cfg, parent_run_id)

        return _failing_quietly(body)

    sweep_flow.__name__ = sweep_flow.__qualname__ = f"{stage.name.replace('-', '_')}_flow"
    sweep_flow.__doc__ = stage.summary
    return flow(name=stage.name, description=stage.summary)(sweep_flow)


STAGE_FLOWS |= {s.name: _sweep_flow(s) for s in STAGES if s.kind == "sweep"}
globals().update({f.fn.__name__: f for f in STAGE_FLOWS.values()})
assert set(STAGE_FLOWS) == set(ALL), "a declared stage without a flow"


@flow(name="rebuild")
def rebuild_flow(workdir: str | None = None, preset: str | None = None, overrides: dict[str, Any] | None = None,
                 stages: list[str] | None = None, force: list[str] | None = None, config: MuleConfig | None = None,
                 plan: rebuild.Plan | None = None, sequential: bool = False) -> dict:  # fmt: skip
    """The pipeline: every stage in order (or the ones named), under one parent MLflow run.
    A stage runs only when its key changed (its inputs' content, its config, its code) or
    when named in `force`; the others are reused, and the run says which and why.
    `config`: the config already resolved (by the command; a deployment names a preset and
    overrides instead); `plan`: the run already planned, with the decisions taken so far
    (by the command: each stage is decided once).
    `sequential`: changes nothing (stages run one at a time since 2026-12-02); taken still,
    so that a deployment saved with it runs."""
    return _failing_quietly(partial(_rebuild, workdir, preset, overrides, stages, force, config, plan))


def _rebuild(workdir: str | None, preset: str | None, overrides: dict[str, Any] | None, stages: list[str] | None,
             force: list[str] | None, resolved: MuleConfig | None, planned: rebuild.Plan | None) -> dict:  # fmt: skip
    named, forced = checked_stages(stages), set(checked_stages(force) if force else [])
    label = planned.name if planned is not None else rebuild.run_name(named)
    with _working(workdir, preset, overrides, label, resolved) as (wd, cfg):
        planned = planned if planned is not None else rebuild.plan(wd, cfg, named, forced)
        return rebuild.run(wd, cfg, planned, hooks())
