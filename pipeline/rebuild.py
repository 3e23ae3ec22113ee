"""The rebuild's body, without Prefect: decide each stage, run or reuse it, report.

flows/stages.py runs it inside the `rebuild` flow, with each stage that must run as a
flow of its own. The CLI first asks `up_to_date`: when every stage's key is unchanged,
nothing would run, so it records the rebuild (an MLflow run per stage that says
"reused" and why, as in a flow) without starting Prefect at all, the way `make` says
"nothing to be done". A no-change rebuild then costs the keys and MLflow, not Prefect's
server (about 6 s of 11 on 2 cores).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from mule.data_catalog.workdir import Workdir
from mule.mule_core.config import MuleConfig

from . import reuse
from .declaration import BY_NAME, REBUILD
from .runner import prepare

# (stage, decision as a dict or None for a sweep) -> the stage's result, run as a flow of its own
RunStage = Callable[[str, dict | None], dict]
# (workdir, config, decision, parent run id) -> the recorded result
ReuseStage = Callable[[Workdir, MuleConfig, reuse.Decision, str | None], dict]


def run_name(stages: list[str]) -> str:
    return "rebuild" if stages == list(REBUILD) else "run: " + " ".join(stages)


def plan(wd: Workdir, cfg: MuleConfig, named: list[str]) -> list[str]:
    """The stages a run of `named` runs, in order: the named ones, what the sweeps among
    them need, and any stage upstream whose outputs were damaged since it wrote them
    (it runs again first, so that no stage reads a damaged file)."""
    import logging

    from .declaration import in_pipeline_order, with_upstream

    stages = with_upstream(named, cfg)
    damaged = reuse.damaged_upstream(wd, cfg, stages)
    for stage, why in damaged.items():
        logging.getLogger("mule.pipeline").warning("%s runs again first: %s", stage, why)
    return in_pipeline_order([*stages, *damaged])


def up_to_date(wd: Workdir, cfg: MuleConfig, stages: list[str], forced: set[str]) -> dict[str, reuse.Decision] | None:
    """Every stage's decision when none of them has to run (a sweep: every step of every
    variant); None as soon as one does (then the rebuild decides again, stage by stage,
    as the stages before it write)."""
    if forced:
        return None
    decided = {}
    for stage in stages:
        if BY_NAME[stage].kind == "sweep":
            from . import sweeps  # its variants' reports: imported only for a sweep

            if not sweeps.up_to_date(wd, cfg, stage):
                return None
            continue
        if not prepare(wd, cfg, stage, act=False):
            return None
        decision = reuse.decide(wd, cfg, stage)
        if decision.run:
            return None
        decided[stage] = decision
    return decided


def run_stages(wd: Workdir, cfg: MuleConfig, stages: list[str], forced: set[str], run_id: str | None,
               run_stage: RunStage | None, reuse_stage: ReuseStage,
               decided: dict[str, reuse.Decision] | None = None) -> tuple[dict[str, Any], dict[str, str]]:  # fmt: skip
    """Each stage in order: reused (an MLflow run saying so) or run by `run_stage`; a sweep
    by `run_stage` too (its steps decide variant by variant). `decided`: decisions already
    taken (by `up_to_date`). Returns (results, decisions)."""
    results: dict[str, Any] = {}
    decisions: dict[str, str] = {}
    for stage in stages:
        if BY_NAME[stage].kind == "sweep":  # in its own flow; here, when up_to_date said all is reused
            results[stage] = run_stage(stage, None) if run_stage else _sweep_here(wd, cfg, stage, run_id)
            decisions[stage] = _sweep_decisions(results[stage])
            continue
        decision = (decided or {}).get(stage)
        if decision is None:
            prepare(wd, cfg, stage)
            decision = reuse.decide(wd, cfg, stage, stage in forced)
        if decision.run:  # its own flow run (and MLflow run), handed the decision and the config
            results[stage] = _must(run_stage)(stage, reuse.as_dict(decision))
        else:
            results[stage] = reuse_stage(wd, cfg, decision, run_id)
        decisions[stage] = decision.describe()
    return results, decisions


def _sweep_here(wd: Workdir, cfg: MuleConfig, stage: str, run_id: str | None) -> dict:
    from .runner import Runner
    from .sweeps import run_sweep

    return run_sweep(stage, Runner(wd), cfg, run_id)


def _sweep_decisions(result: dict) -> str:
    """A sweep's line: how many of its steps ran and how many were reused."""
    steps = result.get("steps", {}) if isinstance(result, dict) else {}
    ran = sum(1 for d in steps.values() if d.startswith("ran"))
    return f"ran ({ran} of {len(steps)} steps ran, {len(steps) - ran} reused)" if ran else f"reused ({len(steps)} steps)"


def _must(run_stage: RunStage | None) -> RunStage:
    if run_stage is None:
        raise RuntimeError("a stage has to run, and no runner was given")  # up_to_date said none would
    return run_stage


def report(wd: Workdir, cfg: MuleConfig, results: dict, decisions: dict[str, str], run_id: str | None) -> None:
    """The decisions, and the test recalls, on the rebuild's MLflow run."""
    from mule.experiments import tracking

    reuse.report_decisions(wd, cfg, decisions, run_id)
    tracker = tracking.Tracker(wd, run_id)
    if "ablation" in results:
        tracker.artifact(Path(results["ablation"]["results_dir"]) / "ablation.md")
    if "evaluate" in results and results["evaluate"]["table"]:
        table, split = results["evaluate"]["table"], results["evaluate"]["split"]
        per_language = {f"{split}.{lang}.mR": row["mR"] for lang, row in table.items()}
        tracker.metrics({f"{split}.mean_mR": results["evaluate"]["mean_mR"], **per_language})
        for name in ("recalls.md", "recalls.csv", "recalls.png"):
            path = wd.results_dir(cfg.data.dataset) / name
            if path.exists():
                tracker.artifact(path)
