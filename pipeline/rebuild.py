"""The rebuild's one body (`run`): plan, decide each stage, run or reuse it, report.

Two callers, one body: `mule run` and `mule demo` call it first without an orchestrator
(`run_stage=None`): when every stage's key is unchanged, nothing would run, so it returns
the results at once, the way `make` says "nothing to be done", without Prefect, MLflow or
torch (pipeline.deferred records the reuse in MLflow right after); else it returns None,
and the command starts Prefect and the `rebuild` flow (flows/stages.py), which calls it
again with each stage that must run as a flow of its own.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from mule.config.sections import MuleConfig
from mule.pipeline import decisions, reused_stages
from mule.pipeline.declaration import BY_NAME, REBUILD
from mule.pipeline.runner import prepare
from mule.storage.workdir import Workdir

# (stage, decision as a dict or None for a sweep, the rebuild's MLflow run) -> the stage's
# result, run as a flow of its own
RunStage = Callable[[str, dict | None, str | None], dict]
# (workdir, config, decision, parent run id) -> the recorded result
ReuseStage = Callable[[Workdir, MuleConfig, decisions.Decision, str | None], dict]


def run(wd: Workdir, cfg: MuleConfig, named: list[str], forced: set[str] | None = None,
        run_stage: RunStage | None = None, reuse_stage: ReuseStage | None = None) -> dict | None:  # fmt: skip
    """The stages named (and what they need, and what was damaged) under one parent MLflow
    run: each reused when its key is unchanged, else run by `run_stage` (a stage's flow).
    The caller holds the workdir's lock and has adopted it. Without `run_stage`: the
    results when nothing has to run (recorded in MLflow now only when a stage has something
    to publish or a sweep is named; else right after, by pipeline.deferred), None when a
    stage has to run."""
    import os

    from mule.pipeline import deferred

    forced = set(forced or ())
    reuse_stage = reuse_stage or reused_stages.reuse_stage
    name = run_name(named)
    stages = plan(wd, cfg, named)
    decided = None
    if run_stage is None:
        decided = up_to_date(wd, cfg, stages, forced)
        if decided is None:
            return None
        later = not any(decisions.publish_pending(d) for d in decided.values()) and all(
            BY_NAME[s].kind != "sweep" for s in stages)  # fmt: skip
        if later and os.environ.get("MULE_RECORD_LATER") != "0":
            results = {stage: decisions.reused_result(d, wd) for stage, d in decided.items()}
            deferred.defer(wd, cfg, name, decided, results)
            deferred.start_recorder(wd)
            return results | {"mlflow_run_id": None, "stages": {s: d.describe() for s, d in decided.items()}}
    from mule.experiments import tracking

    deferred.record_unrecorded(wd)  # what a no-change rebuild left to record, first
    with tracking.run(wd, cfg, name) as run_id:
        results, described = run_stages(wd, cfg, stages, forced, run_id, run_stage, reuse_stage, decided)
        from mule.pipeline.publish import publish_rebuild

        publish_rebuild(wd, cfg, results, described, run_id)
    return results | {"mlflow_run_id": run_id, "stages": described}


def run_name(stages: list[str]) -> str:
    return "rebuild" if stages == list(REBUILD) else "run: " + " ".join(stages)


def plan(wd: Workdir, cfg: MuleConfig, named: list[str]) -> list[str]:
    """The stages a run of `named` runs, in order: the named ones, what the sweeps among
    them need, and any stage upstream whose outputs were damaged since it wrote them
    (it runs again first, so that no stage reads a damaged file)."""
    import logging

    from mule.pipeline.declaration import in_pipeline_order, with_upstream

    stages = with_upstream(named, cfg)
    damaged = decisions.damaged_upstream(wd, cfg, stages)
    for stage, why in damaged.items():
        logging.getLogger("mule.pipeline").warning("%s runs again first: %s", stage, why)
    retokenise = _tokenizers_changed(wd, cfg, stages)
    if retokenise:  # the stored tokens are another tokeniser's: ingest and what follows from it first
        from mule.pipeline.declaration import writers_upstream

        upstream = [s for s in writers_upstream(stages, cfg) if s not in stages]
        logging.getLogger("mule.pipeline").warning("text.tokenizers changed since the captions were tokenised (%s): "
                                                   "%s run first, each reused where its key says so", retokenise,
                                                   ", ".join(upstream) or "ingest")  # fmt: skip
        stages = [*stages, *upstream]
    return in_pipeline_order([*stages, *damaged])


def _tokenizers_changed(wd: Workdir, cfg: MuleConfig, stages: list[str]) -> str:
    """"en: moses -> unicode" when text.tokenizers names other tokenisers than those that made
    the stored captions' tokens, and a stage planned uses those tokens; "" otherwise."""
    from mule.pipeline.declaration import BY_NAME

    steps = [step for s in stages for step in (BY_NAME[s].steps or (s,))]
    if not any(_declares(BY_NAME[s], "text.tokenizers") for s in steps if s != "ingest"):
        return ""
    from mule.data_catalog.tables import Catalog
    from mule.stages.shared.token_identity import changed

    differ = changed(Catalog(wd), cfg.data.dataset, cfg.data.languages, cfg.text.tokenizers)
    return ", ".join(f"{lang}: {old} -> {new}" for lang, (old, new) in differ.items())


def _declares(stage, option: str) -> bool:
    return any(option == c or (c.endswith(".") and option.startswith(c)) for c in stage.config)


def up_to_date(wd: Workdir, cfg: MuleConfig, stages: list[str], forced: set[str]) -> dict[str, decisions.Decision] | None:
    """Every stage's decision when none of them has to run (a sweep: every step of every
    variant); None as soon as one does (then the rebuild decides again, stage by stage,
    as the stages before it write)."""
    if forced:
        return None
    decided = {}
    for stage in stages:
        if BY_NAME[stage].kind == "sweep":
            from mule.pipeline import sweeps  # its variants' reports: imported only for a sweep

            if not sweeps.up_to_date(wd, cfg, stage):
                return None
            continue
        if not prepare(wd, cfg, stage, act=False):
            return None
        decision = decisions.decide(wd, cfg, stage)
        if decision.run:
            return None
        decided[stage] = decision
    return decided


def run_stages(wd: Workdir, cfg: MuleConfig, stages: list[str], forced: set[str], run_id: str | None,
               run_stage: RunStage | None, reuse_stage: ReuseStage,
               decided: dict[str, decisions.Decision] | None = None) -> tuple[dict[str, Any], dict[str, str]]:  # fmt: skip
    """Each stage in order: reused (an MLflow run saying so) or run by `run_stage`; a sweep
    by `run_stage` too (its steps decide variant by variant). `decided`: decisions already
    taken (by `up_to_date`). Returns (results, decisions)."""
    results: dict[str, Any] = {}
    described: dict[str, str] = {}
    for stage in stages:
        if BY_NAME[stage].kind == "sweep":  # in its own flow; here, when up_to_date said all is reused
            results[stage] = run_stage(stage, None, run_id) if run_stage else _sweep_here(wd, cfg, stage, run_id)
            described[stage] = _sweep_decisions(results[stage])
            continue
        decision = (decided or {}).get(stage)
        if decision is None:
            prepare(wd, cfg, stage)
            decision = decisions.decide(wd, cfg, stage, stage in forced)
        if decision.run:  # its own flow run (and MLflow run), handed the decision and the config
            results[stage] = _must(run_stage)(stage, decisions.as_dict(decision), run_id)
        else:
            results[stage] = reuse_stage(wd, cfg, decision, run_id)
        described[stage] = decision.describe()
    return results, described


def _sweep_here(wd: Workdir, cfg: MuleConfig, stage: str, run_id: str | None) -> dict:
    from mule.pipeline.runner import Runner
    from mule.pipeline.sweeps import run_sweep

    return run_sweep(stage, Runner(wd), cfg, run_id)


def _sweep_decisions(result: dict) -> str:
    """A sweep's line: how many of its steps ran and how many were reused."""
    steps = result.get("steps", {}) if isinstance(result, dict) else {}
    ran = sum(1 for d in steps.values() if d.startswith("ran"))
    return (
        f"ran ({ran} of {len(steps)} steps ran, {len(steps) - ran} reused)" if ran else f"reused ({len(steps)} steps)"
    )


def _must(run_stage: RunStage | None) -> RunStage:
    if run_stage is None:
        raise RuntimeError("a stage has to run, and no runner was given")  # up_to_date said none would
    return run_stage
