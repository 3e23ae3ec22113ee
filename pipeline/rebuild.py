"""The rebuild's one body: plan once, decide each stage once, run or reuse it, report.

    planned = rebuild.plan(wd, cfg, ["train"])          # the stages, in order, and what they need
    if rebuild.decide_ahead(wd, cfg, planned):          # nothing has to run
        results = rebuild.finish_unchanged(wd, cfg, planned)   # no Prefect, no MLflow, no torch
    else:
        results = rebuild.run(wd, cfg, planned, hooks)  # in Prefect's rebuild flow (flows/stages.py)

Every stage is decided once per run. `decide_ahead` decides the stages in order until
one has to run, and its decisions travel in the plan; `run` takes them and decides each
later stage when the stages before it have written what it reads. `mule run` and `mule
demo` call both; the rebuild flow (a deployment's run) plans when it is handed no plan.
What happens around each stage (MLflow, publishing, Prefect's task) is the hooks'
(pipeline.hooks); the runner (pipeline.runner) computes and records.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field
from typing import Any

from mule.config.sections import MuleConfig
from mule.pipeline import decisions
from mule.pipeline.declaration import BY_NAME, REBUILD, in_pipeline_order, with_upstream, writers_upstream
from mule.pipeline.runner import Runner, prepare
from mule.storage.content_digests import FileHasher
from mule.storage.workdir import Workdir


@dataclass
class Plan:
    """What one run runs: the stages named, in pipeline order with what they need, and the
    decisions taken so far (each stage's, once; a sweep's, every step of every variant)."""

    named: list[str]
    stages: list[str]
    forced: set[str] = field(default_factory=set)
    decided: dict[str, decisions.Decision] = field(default_factory=dict)
    sweeps_decided: dict[str, dict[tuple[str, str], decisions.Decision]] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return run_name(self.named)


@dataclass
class PipelineRun:
    """What the hooks around a whole run see (Kedro's before/after_pipeline_run)."""

    workdir: Workdir
    cfg: MuleConfig
    plan: Plan
    run_id: str | None = None  # the run's own MLflow run, once a hook opened one
    results: dict[str, Any] = field(default_factory=dict)
    described: dict[str, str] = field(default_factory=dict)  # stage -> "ran (...)" | "reused (...)"
    exits: ExitStack = field(default_factory=ExitStack)


def run_name(stages: list[str]) -> str:
    return "rebuild" if list(stages) == list(REBUILD) else "run: " + " ".join(stages)


def plan(wd: Workdir, cfg: MuleConfig, named: list[str], forced: set[str] | None = None) -> Plan:
    """The stages a run of `named` runs, in order: the named ones, what the sweeps among
    them need, and any stage upstream whose outputs were damaged since it wrote them
    (it runs again first, so that no stage reads a damaged file)."""
    named = in_pipeline_order(named)
    stages = with_upstream(named, cfg)
    damaged = decisions.damaged_upstream(wd, cfg, stages)
    for stage, why in damaged.items():
        logger().warning("%s runs again first: %s", stage, why)
    retokenise = _tokenizers_changed(wd, cfg, stages)
    if retokenise:  # the stored tokens are another tokeniser's: ingest and what follows from it first
        upstream = [s for s in writers_upstream(stages, cfg) if s not in stages]
        logger().warning("text.tokenizers changed since the captions were tokenised (%s): %s run first, each reused "
                         "where its key says so", retokenise, ", ".join(upstream) or "ingest")  # fmt: skip
        stages = [*stages, *upstream]
    return Plan(named, in_pipeline_order([*stages, *damaged]), set(forced or ()))


def _tokenizers_changed(wd: Workdir, cfg: MuleConfig, stages: list[str]) -> str:
    """"en: moses -> unicode" when text.tokenizers names other tokenisers than those that made
    the stored captions' tokens, and a stage planned uses those tokens; "" otherwise."""
    steps = [step for s in stages for step in (BY_NAME[s].steps or (s,))]
    if not any(_declares(BY_NAME[s], "text.tokenizers") for s in steps if s != "ingest"):
        return ""
    from mule.data_catalog.tables import Catalog
    from mule.tasks.shared.token_identity import changed

    differ = changed(Catalog(wd), cfg.data.dataset, cfg.data.languages, cfg.text.tokenizers)
    return ", ".join(f"{lang}: {old} -> {new}" for lang, (old, new) in differ.items())


def _declares(stage, option: str) -> bool:
    return any(option == c or (c.endswith(".") and option.startswith(c)) for c in stage.config)


def decide_ahead(wd: Workdir, cfg: MuleConfig, planned: Plan) -> bool:
    """Decides the plan's stages in order, keeping each decision in the plan, until one has
    to run: True when none has (a sweep: every step of every variant reused). A stage that
    must be prepared first (a dataset to generate) is left to decide when it runs."""
    if planned.forced:
        return False
    hasher = FileHasher(wd)
    for stage in planned.stages:
        if BY_NAME[stage].kind == "sweep":
            from mule.pipeline import sweeps  # its variants' reports: imported only for a sweep

            steps = sweeps.decide_steps(wd, cfg, stage)
            if steps is None:
                return False
            planned.sweeps_decided[stage] = steps
            continue
        if not prepare(wd, cfg, stage, act=False):
            return False
        planned.decided[stage] = decisions.decide(wd, cfg, stage, hasher=hasher)
        if planned.decided[stage].run:
            return False
    return True


def finish_unchanged(wd: Workdir, cfg: MuleConfig, planned: Plan, hooks: Sequence[Any]) -> dict:
    """A run where every stage is reused (decide_ahead said so): the results the records
    hold, at once, without Prefect, MLflow or torch; the reuse waits in the workdir for
    whoever opens MLflow next to record it (pipeline.deferred: the next run, `mule ui`).
    When a stage has something left to publish or a sweep is named, it is recorded now,
    here, with `hooks`."""
    from mule.pipeline import deferred

    later = not any(decisions.publish_pending(d) or decisions.registered_model_gone(wd, d)
                    for d in planned.decided.values()) and all(BY_NAME[s].kind != "sweep" for s in planned.stages)  # fmt: skip
    if not later or os.environ.get("MULE_RECORD_LATER") == "0":
        return run(wd, cfg, planned, hooks)
    results = {stage: decisions.reused_result(d, wd) for stage, d in planned.decided.items()}
    deferred.defer(wd, cfg, planned.name, planned.decided, results)
    return results | {"mlflow_run_id": None, "stages": {s: d.describe() for s, d in planned.decided.items()}}


def run(wd: Workdir, cfg: MuleConfig, planned: Plan, hooks: Sequence[Any]) -> dict:
    """The plan's stages in order under the hooks (the rebuild's MLflow run around them all):
    each reused or computed by the runner with the decision the plan holds, or one taken
    now, once. The caller holds the workdir's lock and has adopted it."""
    from mule.pipeline import deferred

    deferred.record_unrecorded(wd)  # what a no-change run left to record, first
    runner = Runner(wd, hooks)
    whole = PipelineRun(wd, cfg, planned)

    with whole.exits:
        _call(hooks, "before_pipeline_run", whole)
        # one at a time, in pipeline order: each after the stages whose outputs it reads
        # (docs/architecture.md, "One stage at a time")
        for stage in planned.stages:
            if BY_NAME[stage].kind == "sweep":
                from mule.pipeline import sweeps

                whole.results[stage] = sweeps.run_sweep(stage, runner, cfg, whole.run_id,
                                                        planned.sweeps_decided.get(stage))  # fmt: skip
                whole.described[stage] = _sweep_line(whole.results[stage])
                continue
            decision = planned.decided.get(stage) or runner.decide(cfg, stage, stage in planned.forced)
            whole.results[stage] = runner.run(cfg, stage, whole.run_id, decision=decision)
            whole.described[stage] = decision.describe()
        whole.results = {s: whole.results[s] for s in planned.stages if s in whole.results}  # pipeline order
        whole.described = {s: whole.described[s] for s in planned.stages if s in whole.described}
        _call(hooks, "after_pipeline_run", whole)
    return whole.results | {"mlflow_run_id": whole.run_id, "stages": whole.described}


def _call(hooks: Sequence[Any], point: str, whole: PipelineRun) -> None:
    for hook in hooks:
        getattr(hook, point)(whole)


def _sweep_line(result: dict) -> str:
    """A sweep's line: how many of its steps ran and how many were reused."""
    steps = result.get("steps", {}) if isinstance(result, dict) else {}
    ran = sum(1 for d in steps.values() if d.startswith("ran"))
    return (
        f"ran ({ran} of {len(steps)} steps ran, {len(steps) - ran} reused)" if ran else f"reused ({len(steps)} steps)"
    )


def logger() -> logging.Logger:
    return logging.getLogger("mule.pipeline")
