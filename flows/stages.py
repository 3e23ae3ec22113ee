"""The Prefect flows: one per stage declared in pipeline.declaration, and `rebuild`,
which chains them.

Stages talk only through the catalog and the workdir, so each flow runs alone: rerun
`train` after changing a loss weight, or `features` after adding images. Every flow
takes the same parameters: workdir, preset, overrides (dotted config options), and,
when called by `rebuild`, the MLflow run to nest under and the rebuild's decision (the
key is taken once). A stage's task module is imported when the stage runs: a rebuild
that reuses everything never imports torch's training code.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from prefect import flow, task, unmapped
from prefect.cache_policies import NO_CACHE
from prefect.states import Failed

from data_catalog.catalog import Catalog, write_text_atomic
from data_catalog.locks import holds_lock, workdir_lock
from data_catalog.workdir import Workdir
from flows.runtime import dask_task_runner, quiet_user_errors
from mule_core.config import ConfigError, MuleConfig, from_dict, resolve, to_dict
from mule_core.errors import is_user_error
from pipeline import rebuild, reuse
from pipeline.declaration import ALL, BY_NAME, REBUILD, STAGES, Stage, in_pipeline_order


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
def _working(workdir: str | None, preset: str, overrides: dict[str, Any] | None, stage: str,
             config: dict | None = None) -> Iterator[tuple[Workdir, MuleConfig, dict]]:  # fmt: skip
    """The workdir, under its lock (one mule process at a time), its stored paths pointed
    at itself if it was copied or moved, and the config: resolved here, or handed down
    already resolved by the rebuild (which took the lock and checked the workdir)."""
    from experiments import relocation

    wd = _workdir(workdir)
    cfg = from_dict(config) if config is not None else resolve(preset, overrides)
    nested = holds_lock(wd)
    with workdir_lock(wd, stage):
        if not nested:
            relocation.adopt(wd)
        yield wd, cfg, to_dict(cfg)


def _failing_quietly(body):
    """Runs body(); a user error ends the flow run Failed with exactly its message (and no
    traceback in the log: flows.runtime.quiet_user_errors), then reaches the caller."""
    quiet_user_errors()
    try:
        return body()
    except Exception as error:
        if is_user_error(error):
            return Failed(message=str(error), data=error)
        raise


def _features_on_dask(root: str, config: dict, run_id: str) -> dict:
    """The features stage with features.runner=dask: its shards mapped over Dask workers."""
    from tasks.features import extract_features, extract_shard, finish_features, plan_features

    if config["features"]["runner"] != "dask":
        return extract_features(root, config, run_id)
    plan = plan_features(root, config)
    if not plan["shards"]:
        return finish_features(root, config, run_id, plan, [])
    runner = dask_task_runner(config["features"], len(plan["shards"]))

    @flow(name="features-shards", task_runner=runner)
    def shards_flow() -> list[dict]:
        futures = extract_shard.map(unmapped(root), unmapped(config), plan["shards"], unmapped(plan["todo"]))
        return [future.result() for future in futures]

    return finish_features(root, config, run_id, plan, shards_flow())


# A stage whose work is more than its task: how it runs, by stage name.
RUNNERS = {"features": _features_on_dask}


# A reused stage in a rebuild: no flow run of its own, a task run in the rebuild's.
reuse_stage = task(name="reuse-stage", task_run_name="{decision.stage}: reused", cache_policy=NO_CACHE)(
    reuse.reuse_stage
)


def run_stage(stage: Stage, workdir: str | None, preset: str, overrides: dict[str, Any] | None,
              parent_run_id: str | None, force: bool = False, decided: dict | None = None,
              config: dict | None = None) -> dict:  # fmt: skip
    """One stage: its MLflow run around its task, under the workdir's lock, run only when
    its key changed (pipeline.reuse) or when forced. `decided`: the rebuild's decision."""
    from experiments import tracking

    with _working(workdir, preset, overrides, stage.name, config) as (wd, cfg, config):
        if decided is None:
            prepare = stage.load_prepare()
            if prepare:
                prepare(str(wd.root), config)
            decision = reuse.decide(wd, cfg, stage.name, force)
        else:
            decision = reuse.Decision(**decided)
            decision.record = reuse.previous_record(wd, cfg, decision)
        if not decision.run:
            return reuse_stage(wd, cfg, decision, parent_run_id)
        work = RUNNERS.get(stage.name) or stage.load_task()
        with tracking.run(wd, cfg, stage.name, parent_run_id) as run_id:
            tracking.Tracker(wd, run_id).tags(reuse.tags(decision))
            reuse.logger().info("%s: %s", stage.name, decision.describe())
            result = work(str(wd.root), config, run_id)
            reuse.record(wd, cfg, decision, result, run_id)
            return result


def _stage_flow(stage: Stage):
    """The Prefect flow of a content-addressed stage (they differ only in their declaration)."""

    def stage_flow(workdir: str | None = None, preset: str = "demo", overrides: dict[str, Any] | None = None,
                   parent_run_id: str | None = None, force: bool = False, decided: dict | None = None,
                   config: dict | None = None) -> dict:  # fmt: skip
        return _failing_quietly(lambda: run_stage(stage, workdir, preset, overrides, parent_run_id, force, decided,
                                                  config))  # fmt: skip

    stage_flow.__name__ = stage_flow.__qualname__ = f"{stage.name.replace('-', '_')}_flow"
    stage_flow.__doc__ = stage.summary
    return flow(name=stage.name, description=stage.summary)(stage_flow)


STAGE_FLOWS: dict[str, Any] = {s.name: _stage_flow(s) for s in STAGES if s.keyed}
# Module attributes for prefect.yaml's entrypoints (flows/stages.py:train_flow, ...).
globals().update({f.fn.__name__: f for f in STAGE_FLOWS.values()})


def _train_variant(wd: Workdir, variant: MuleConfig, run_id: str) -> dict:
    """One model of the ablation or add-language: trained, or reused when the train stage's
    key for its config (its inputs, its options, its code) is unchanged; one record per
    model name, as the train stage keeps (pipeline.reuse). Its MLflow run says which."""
    from dataclasses import replace

    from experiments import tracking
    from tasks.train import train_model

    decision = reuse.decide(wd, variant, "train")
    tracking.Tracker(wd, run_id).tags(reuse.tags(decision))
    if not decision.run:
        reuse.logger().info("%s: %s", variant.train.model_name, decision.describe())
        return reuse.reused_result(decision, wd)
    fresh = replace(variant, train=replace(variant.train, reuse=False))  # the key decided: no second guess
    result = train_model(str(wd.root), to_dict(fresh), run_id)
    reuse.record(wd, variant, decision, result, run_id)
    return result


@flow(name="ablation")
def ablation_flow(workdir: str | None = None, preset: str = "demo", overrides: dict[str, Any] | None = None,
                  parent_run_id: str | None = None) -> dict:  # fmt: skip
    """Baselines and MULE's parts (the paper's Table 2), each a child run; runs the stages
    whose outputs are missing first."""
    return _failing_quietly(lambda: _ablation(workdir, preset, overrides, parent_run_id))


def _ablation(workdir: str | None, preset: str, overrides: dict[str, Any] | None, parent_run_id: str | None) -> dict:
    from experiments import tracking
    from tasks import ablation
    from tasks.evaluate import evaluate_model

    with _working(workdir, preset, overrides, "ablation") as (wd, cfg, config):
        root = str(wd.root)
        with tracking.run(wd, cfg, "ablation", parent_run_id) as run_id:
            for stage in ablation.missing_inputs(root, config):
                STAGE_FLOWS[stage](workdir=root, preset=preset, overrides=overrides, parent_run_id=run_id)
            rows, english = [], []
            seeds = [cfg.train.seed + i for i in range(cfg.ablation.seeds)]
            with_mt = Catalog(wd).has_table("captions", f"{cfg.data.dataset}.mt")  # the translate stage ran
            grid = ablation.grid(list(cfg.data.languages), seeds, with_mt)
            for captions in ablation.missing_lp_models(root, config, grid):  # LP on human + MT, on MT only
                STAGE_FLOWS["pretrain"](workdir=root, preset=preset, overrides={**(overrides or {}), "data.captions": captions},
                              parent_run_id=run_id)  # fmt: skip
            for row in grid:
                evaluations, trainings = [], []
                for model in row.models:
                    variant = resolve(preset, {**(overrides or {}), **model.overrides})
                    with tracking.run(wd, variant, f"ablation: {model.label}", run_id) as child:
                        trainings.append(_train_variant(wd, variant, child))
                        evaluations.append(evaluate_model(root, to_dict(variant), child))
                rows.append(ablation.row_result(row, evaluations, trainings))
                english += ablation.english_models(row.models)
            if english:
                with tracking.run(wd, cfg, "ablation: translate the query", run_id) as child:
                    translated = ablation.translate_the_query(root, config, child, english)
                if translated is not None:
                    rows.insert(1, translated)
            return ablation.summarize(root, config, run_id, rows)


@flow(name="add-language")
def add_language_flow(workdir: str | None = None, preset: str = "demo", overrides: dict[str, Any] | None = None,
                      parent_run_id: str | None = None) -> dict:  # fmt: skip
    """Adds train.add_language to a model trained without it (trained first when missing),
    and compares it with the model trained from scratch on every language."""
    return _failing_quietly(lambda: _add_language(workdir, preset, overrides, parent_run_id))


def _add_language(
    workdir: str | None, preset: str, overrides: dict[str, Any] | None, parent_run_id: str | None
) -> dict:
    from experiments import tracking
    from tasks import ablation
    from tasks.add_language import add_language, added_model_name, base_model_name
    from tasks.evaluate import evaluate_model
    from tasks.pretrain import pretrain_mule

    overrides = dict(overrides or {})
    with _working(workdir, preset, overrides, "add-language") as (wd, cfg, config):
        lang, root = cfg.train.add_language, str(wd.root)
        if not lang:
            raise ConfigError("add-language needs a language: mule run add-language --lang ja (train.add_language)")
        others = [x for x in cfg.data.languages if x != lang]
        if not others:
            raise ConfigError(f"data.languages {list(cfg.data.languages)} has no language besides {lang} to start from")
        base_name, added_name = (
            base_model_name(lang, cfg.train.base_model),
            added_model_name(lang, cfg.train.base_model),
        )
        variants = {
            f"without {lang}": {"data.languages": ",".join(others), "train.model_name": base_name},
            f"without {lang}, then {lang} added": {"train.model_name": added_name},
            "every language from scratch": {"train.model_name": "model"},
        }
        with tracking.run(wd, cfg, f"add-language {lang}", parent_run_id) as run_id:
            for stage in ablation.missing_inputs(root, config):
                STAGE_FLOWS[stage](workdir=root, preset=preset, overrides=overrides, parent_run_id=run_id)
            rows = {}
            for label, extra in variants.items():
                adding = label.endswith("added")
                settings = {**overrides, **extra, "train.reuse": True, "train.add_language": lang if adding else ""}
                variant = resolve(preset, settings)
                with tracking.run(wd, variant, f"add-language: {label}", run_id) as child:
                    if not adding:
                        if variant.pretrain.enabled:  # LP over the base languages only: it never sees `lang`
                            pretrain_mule(root, to_dict(variant), child)
                        trained = _train_variant(wd, variant, child)
                    else:
                        trained = add_language(root, to_dict(variant), child)
                    rows[label] = {"train": trained, "evaluation": evaluate_model(root, to_dict(variant), child)}
            return _add_language_report(wd, cfg, lang, rows, run_id)


def _add_language_report(wd: Workdir, cfg: MuleConfig, lang: str, rows: dict, run_id: str) -> dict:
    from experiments import tracking
    from tasks.common import logger

    languages = list(cfg.data.languages)
    lines = [
        f"| model | {' | '.join(languages)} | trained parameters | seconds |",
        "|---|" + "---|" * (len(languages) + 2),
    ]
    for label, row in rows.items():
        table, trained = row["evaluation"]["table"], row["train"]
        cells = [f"{table[x]['mR']:.1f}" if x in table else "–" for x in languages]
        parameters = trained.get("trainable_parameters") or (trained.get("parameters") or {}).get("total", "")
        seconds = "reused" if trained.get("reused") else trained.get("seconds", "")
        lines.append(f"| {label} | {' | '.join(cells)} | {parameters:,} | {seconds} |"
                     if isinstance(parameters, int) else f"| {label} | {' | '.join(cells)} | {parameters} | |")  # fmt: skip
    change = rows[f"without {lang}, then {lang} added"]["train"]["existing_languages_max_change"]
    markdown = "\n".join(lines) + f"\n\nBase languages' embeddings after adding {lang}: largest change {change:g}.\n"
    out = wd.results_dir(cfg.data.dataset) / f"add-language-{lang}.md"
    write_text_atomic(markdown, out)
    tracking.Tracker(wd, run_id).artifact(out)
    logger().info("adding %s (test mR per language):\n%s", lang, markdown)
    return {"rows": {k: v["evaluation"]["table"] for k, v in rows.items()}, "markdown": markdown,
            "existing_languages_max_change": change, "report": str(out)}  # fmt: skip


STAGE_FLOWS |= {"ablation": ablation_flow, "add-language": add_language_flow}
assert set(STAGE_FLOWS) == set(ALL), "a declared stage without a flow"


def check_stages(stages: list[str] | None) -> list[str]:
    stages = list(stages or REBUILD)
    unknown = [s for s in stages if s not in BY_NAME]
    if unknown:
        raise ConfigError(f"unknown stage(s) {', '.join(unknown)}; stages are: {', '.join(ALL)}")
    return in_pipeline_order(stages)


@flow(name="rebuild")
def rebuild_flow(workdir: str | None = None, preset: str = "demo", overrides: dict[str, Any] | None = None,
                 stages: list[str] | None = None, force: list[str] | None = None,
                 config: dict | None = None) -> dict:  # fmt: skip
    """The pipeline: every stage in order (or the ones named), under one parent MLflow run.
    A stage runs only when its key changed (its inputs' content, its config, its code) or
    when named in `force`; the others are reused, and the run says which and why.
    `config`: the config already resolved from preset and overrides (by the command)."""
    return _failing_quietly(lambda: _rebuild(workdir, preset, overrides, stages, force, config))


def _rebuild(workdir: str | None, preset: str, overrides: dict[str, Any] | None, stages: list[str] | None,
             force: list[str] | None, resolved: dict | None = None) -> dict:  # fmt: skip
    from experiments import tracking

    stages, forced = check_stages(stages), set(check_stages(force) if force else [])
    name = rebuild.run_name(stages)
    with (
        _working(workdir, preset, overrides, name, resolved) as (wd, cfg, config),
        tracking.run(wd, cfg, name) as run_id,
    ):
        root = str(wd.root)

        def run_stage(stage: str, decided: dict | None) -> dict:
            if decided is None:  # a named-only stage (ablation, add-language)
                return STAGE_FLOWS[stage](workdir=root, preset=preset, overrides=overrides, parent_run_id=run_id)
            return STAGE_FLOWS[stage](workdir=root, preset=preset, overrides=overrides, parent_run_id=run_id,
                                      decided=decided, config=config)  # fmt: skip

        results, decisions = rebuild.run_stages(wd, cfg, config, stages, forced, run_id, run_stage, reuse_stage)
        rebuild.report(wd, cfg, results, decisions, run_id)
    results["mlflow_run_id"] = run_id
    results["stages"] = decisions
    return results
