"""One Prefect flow per stage, and `rebuild`, which chains them.

Stages talk only through the catalog and the workdir, so each flow runs alone: rerun
`train` after changing a loss weight, or `features` after adding images. Every flow
takes the same parameters: workdir, preset, overrides (dotted config options), and,
when called by `rebuild`, the MLflow run to nest under.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from prefect import flow, unmapped
from prefect.states import Failed

from data_catalog.catalog import Catalog, write_text_atomic
from data_catalog.datasets import GENERATED
from data_catalog.locks import workdir_lock
from data_catalog.workdir import Workdir
from flows.runtime import dask_task_runner, quiet_user_errors
from mule_core.config import ConfigError, MuleConfig, resolve, to_dict
from mule_core.errors import is_user_error
from tasks import ablation, relocation, stage_keys, tracking
from tasks.add_language import add_language, added_model_name, base_model_name
from tasks.common import logger
from tasks.evaluate import evaluate_model
from tasks.features import extract_shard, finish_features, plan_features
from tasks.ingest import generate_embedded, ingest_captions
from tasks.pretrain import pretrain_mule
from tasks.text import build_word_vectors
from tasks.train import train_model
from tasks.translate import translate_captions

STAGES = ("ingest", "translate", "features", "text", "pretrain", "train", "evaluate")  # the rebuild
EXTRA_STAGES = ("ablation", "add-language")  # run when named


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
def _working(workdir: str | None, preset: str, overrides: dict[str, Any] | None,
             stage: str) -> Iterator[tuple[Workdir, MuleConfig, dict]]:  # fmt: skip
    """The workdir, under its lock (one mule process at a time), its stored paths pointed
    at itself if it was copied or moved, and the resolved config."""
    wd = _workdir(workdir)
    cfg = resolve(preset, overrides)
    with workdir_lock(wd, stage):
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


def _stage(stage: str, work, workdir, preset, overrides, parent_run_id, force: bool = False, reason: str = "") -> dict:
    """One stage: its MLflow run around its task(s), under the workdir's lock, run only when
    its key changed (tasks.stage_keys) or when forced. `work(root, config, run_id)`."""

    def body() -> dict:
        with _working(workdir, preset, overrides, stage) as (wd, cfg, config):
            PREPARE.get(stage, lambda *_: None)(str(wd.root), config)
            decision = stage_keys.decide(wd, cfg, stage, force)
            if reason and decision.run:  # rebuild decided, and says why
                decision.reason = reason
            if not decision.run:
                return stage_keys.reuse_stage(wd, cfg, decision, parent_run_id)
            with tracking.run(wd, cfg, stage, parent_run_id) as run_id:
                tracking.Tracker(wd, run_id).tags(stage_keys.tags(decision))
                logger().info("%s: %s", stage, decision.describe())
                result = work(str(wd.root), config, run_id)
                stage_keys.record(wd, cfg, decision, result, run_id)
                return result

    return _failing_quietly(body)


def _generate(root: str, config: dict) -> None:
    """The generated datasets are written before ingest's key is taken (it covers their files)."""
    data = config["data"]
    if data["dataset"] in GENERATED and not data["source"]:
        generate_embedded(root, config)


PREPARE = {"ingest": _generate}


@flow(name="ingest")
def ingest_flow(workdir: str | None = None, preset: str = "demo", overrides: dict[str, Any] | None = None,
                parent_run_id: str | None = None, force: bool = False, reason: str = "") -> dict:  # fmt: skip
    """Raw files -> images, captions, rejects (generating the embedded dataset if needed)."""
    return _stage("ingest", ingest_captions, workdir, preset, overrides, parent_run_id, force, reason)


@flow(name="translate")
def translate_flow(workdir: str | None = None, preset: str = "demo", overrides: dict[str, Any] | None = None,
                   parent_run_id: str | None = None, force: bool = False, reason: str = "") -> dict:  # fmt: skip
    """Human captions -> machine-translated captions (translate.backend), cached and resumable."""
    return _stage("translate", translate_captions, workdir, preset, overrides, parent_run_id, force, reason)


@flow(name="features-shards")
def features_shards_flow(workdir: str, config: dict, plan: dict) -> list[dict]:
    """The shards mapped over this flow's task runner (Dask when features.runner=dask)."""
    futures = extract_shard.map(unmapped(workdir), unmapped(config), plan["shards"], unmapped(plan["todo"]))
    return [future.result() for future in futures]


def _features(root: str, config: dict, run_id: str) -> dict:
    plan = plan_features(root, config)
    if config["features"]["runner"] == "dask" and plan["shards"]:
        runner = dask_task_runner(config["features"], len(plan["shards"]))
        shards = features_shards_flow.with_options(task_runner=runner)(root, config, plan)
    else:  # one shard after another in this process: the CNN already uses every core
        shards = [extract_shard(root, config, shard, plan["todo"]) for shard in plan["shards"]]
    return finish_features(root, config, run_id, plan, shards)


@flow(name="features")
def features_flow(workdir: str | None = None, preset: str = "demo", overrides: dict[str, Any] | None = None,
                  parent_run_id: str | None = None, force: bool = False, reason: str = "") -> dict:  # fmt: skip
    """Image files -> CNN features (resumes after the last written part); shards run in
    this process or over Dask workers (features.runner)."""
    return _stage("features", _features, workdir, preset, overrides, parent_run_id, force, reason)


@flow(name="text")
def text_flow(workdir: str | None = None, preset: str = "demo", overrides: dict[str, Any] | None = None,
              parent_run_id: str | None = None, force: bool = False, reason: str = "") -> dict:  # fmt: skip
    """Captions -> vocabulary and word vectors per language."""
    return _stage("text", build_word_vectors, workdir, preset, overrides, parent_run_id, force, reason)


@flow(name="pretrain")
def pretrain_flow(workdir: str | None = None, preset: str = "demo", overrides: dict[str, Any] | None = None,
                  parent_run_id: str | None = None, force: bool = False, reason: str = "") -> dict:  # fmt: skip
    """LP: the MULE layers on sentences of the same image across languages."""
    return _stage("pretrain", pretrain_mule, workdir, preset, overrides, parent_run_id, force, reason)


@flow(name="train")
def train_flow(workdir: str | None = None, preset: str = "demo", overrides: dict[str, Any] | None = None,
               parent_run_id: str | None = None, force: bool = False, reason: str = "") -> dict:  # fmt: skip
    """Joint training (triplet + NC + LC), best epoch on validation mR."""
    return _stage("train", train_model, workdir, preset, overrides, parent_run_id, force, reason)


@flow(name="evaluate")
def evaluate_flow(workdir: str | None = None, preset: str = "demo", overrides: dict[str, Any] | None = None,
                  parent_run_id: str | None = None, force: bool = False, reason: str = "") -> dict:  # fmt: skip
    """Recall table per language on the test split, cross-lingual retrieval, figures."""
    return _stage("evaluate", evaluate_model, workdir, preset, overrides, parent_run_id, force, reason)


@flow(name="ablation")
def ablation_flow(workdir: str | None = None, preset: str = "demo", overrides: dict[str, Any] | None = None,
                  parent_run_id: str | None = None) -> dict:  # fmt: skip
    """Baselines and MULE's parts (the paper's Table 2), each a child run; runs the stages
    whose outputs are missing first."""
    return _failing_quietly(lambda: _ablation(workdir, preset, overrides, parent_run_id))


def _ablation(workdir: str | None, preset: str, overrides: dict[str, Any] | None, parent_run_id: str | None) -> dict:
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
                pretrain_flow(workdir=root, preset=preset, overrides={**(overrides or {}), "data.captions": captions},
                              parent_run_id=run_id)  # fmt: skip
            for row in grid:
                evaluations, trainings = [], []
                for model in row.models:
                    variant = resolve(preset, {**(overrides or {}), **model.overrides})
                    with tracking.run(wd, variant, f"ablation: {model.label}", run_id) as child:
                        trainings.append(train_model(root, to_dict(variant), child))
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
                        trained = train_model(root, to_dict(variant), child)
                    else:
                        trained = add_language(root, to_dict(variant), child)
                    rows[label] = {"train": trained, "evaluation": evaluate_model(root, to_dict(variant), child)}
            return _add_language_report(wd, cfg, lang, rows, run_id)


def _add_language_report(wd: Workdir, cfg: MuleConfig, lang: str, rows: dict, run_id: str) -> dict:
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


STAGE_FLOWS = {
    "ingest": ingest_flow,
    "translate": translate_flow,
    "features": features_flow,
    "text": text_flow,
    "pretrain": pretrain_flow,
    "train": train_flow,
    "evaluate": evaluate_flow,
    "ablation": ablation_flow,
    "add-language": add_language_flow,
}


def check_stages(stages: list[str] | None) -> list[str]:
    stages = list(stages or STAGES)
    unknown = [s for s in stages if s not in STAGE_FLOWS]
    if unknown:
        raise ConfigError(f"unknown stage(s) {', '.join(unknown)}; stages are: {', '.join(STAGES)}")
    order = STAGES + EXTRA_STAGES
    return sorted(set(stages), key=order.index)  # always in pipeline order


@flow(name="rebuild")
def rebuild_flow(workdir: str | None = None, preset: str = "demo", overrides: dict[str, Any] | None = None,
                 stages: list[str] | None = None, force: list[str] | None = None) -> dict:  # fmt: skip
    """The pipeline: every stage in order (or the ones named), under one parent MLflow run.
    A stage runs only when its key changed (its inputs' content, its config, its code) or
    when named in `force`; the others are reused, and the run says which and why."""
    return _failing_quietly(lambda: _rebuild(workdir, preset, overrides, stages, force))


def _rebuild(workdir: str | None, preset: str, overrides: dict[str, Any] | None, stages: list[str] | None,
             force: list[str] | None) -> dict:  # fmt: skip
    stages, forced = check_stages(stages), set(check_stages(force) if force else [])
    name = "rebuild" if stages == list(STAGES) else "run: " + " ".join(stages)
    results: dict[str, Any] = {}
    decisions: dict[str, str] = {}
    with _working(workdir, preset, overrides, name) as (wd, cfg, config), tracking.run(wd, cfg, name) as run_id:
        root = str(wd.root)
        for stage in stages:
            if stage in EXTRA_STAGES:  # not content-addressed: they decide model by model
                results[stage] = STAGE_FLOWS[stage](
                    workdir=root, preset=preset, overrides=overrides, parent_run_id=run_id
                )
                decisions[stage] = "ran"
                continue
            PREPARE.get(stage, lambda *_: None)(root, config)
            decision = stage_keys.decide(wd, cfg, stage, stage in forced)
            if decision.run:  # its own flow run (and MLflow run), told why
                results[stage] = STAGE_FLOWS[stage](workdir=root, preset=preset, overrides=overrides,
                                                    parent_run_id=run_id, force=True, reason=decision.reason)  # fmt: skip
            else:  # no flow run to start: a task run in this one, and an MLflow run saying so
                results[stage] = stage_keys.reuse_stage(wd, cfg, decision, run_id)
            decisions[stage] = decision.describe()
        stage_keys.report_decisions(wd, cfg, decisions, run_id)
        if "ablation" in results:
            tracking.Tracker(wd, run_id).artifact(Path(results["ablation"]["results_dir"]) / "ablation.md")
        if "evaluate" in results and results["evaluate"]["table"]:
            table = results["evaluate"]["table"]
            per_language = {f"test.{lang}.mR": row["mR"] for lang, row in table.items()}
            tracking.Tracker(wd, run_id).metrics({"test.mean_mR": results["evaluate"]["mean_mR"], **per_language})
            for name in ("recalls.md", "recalls.csv", "recalls.png"):
                path = wd.results_dir(cfg.data.dataset) / name
                if path.exists():
                    tracking.Tracker(wd, run_id).artifact(path)
    results["mlflow_run_id"] = run_id
    results["stages"] = decisions
    return results
