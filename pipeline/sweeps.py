"""Sweeps: the ablation (the paper's Table 2, and Table 4's MT rows) and adding a language.
A sweep runs declared stages again under other configs (its variants), each through the
one runner (pipeline.runner): every ablation model and every added language is decided
by the stage's key for its config, one record per model name, exactly as the rebuild's
own train stage is. A rerun of a sweep with nothing changed trains nothing.

Rows are data (`grid`): a row names the models behind it and their config overrides.
What the sweeps need from the rebuild (captions, features, word vectors) comes from the
rebuild itself: `mule run ablation` runs the stages that write it first
(pipeline.declaration.upstream), reused when they are up to date.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Any

from data_catalog.catalog import Catalog
from experiments import tracking
from mule_core.config import ConfigError, MuleConfig, apply_overrides

from . import publish
from .runner import Runner

ABLATION_DIR = "ablation"


@dataclass(frozen=True)
class Model:
    label: str  # run name
    slug: str  # models/<dataset>/ablation/<slug>.pt
    overrides: dict[str, Any]


@dataclass(frozen=True)
class Row:
    name: str
    models: list[Model]
    note: str = ""


@dataclass
class RowResult:
    name: str
    mr: dict[str, float] = field(default_factory=dict)  # language -> mR (mean over seeds)
    parameters: int = 0
    language_specific: int = 0
    note: str = ""
    std: dict[str, float] = field(default_factory=dict)  # language -> std over seeds (several seeds only)
    seeds: int = 1


def model_name(slug: str) -> str:
    return f"{ABLATION_DIR}/{slug}"


def grid(languages: list[str], seeds: list[int] | None = None, with_mt: bool = False) -> list[Row]:
    """The rows of the ablation, in the paper's order; with several seeds, each row holds
    its models once per seed (the first seed keeps the plain names). with_mt (the translate
    stage has run): Table 4's rows too, trained on human + machine-translated captions, and
    MULE on MT only (English human captions, the other languages only as translations)."""
    seeds = seeds or [0]
    without = {"loss.nc": False, "loss.lc": False, "pretrain.enabled": False}

    def one_seed(label: str, slug: str, seed: int, overrides: dict[str, Any]) -> Model:
        suffix = "" if seed == seeds[0] else f"-s{seed}"
        return Model(f"{label}{f' (seed {seed})' if suffix else ''}", f"{slug}{suffix}",
                     {**overrides, "train.seed": seed, "train.model_name": model_name(f"{slug}{suffix}")})  # fmt: skip

    def models(label: str, slug: str, **overrides: Any) -> list[Model]:
        return [one_seed(label, slug, seed, overrides) for seed in seeds]

    mule = {"loss.nc": True, "loss.lc": True, "pretrain.enabled": True}
    rows = [
        Row("EmbN (one model per language)",
            [m for lang in languages
             for m in models(f"EmbN {lang}", f"embn-{lang}", **without, **{"model.sharing": "parallel", "data.languages": lang})]),
        Row("PARALLEL-EmbN", models("PARALLEL-EmbN", "parallel", **without, **{"model.sharing": "parallel"})),
        Row("MULE EmbN", models("MULE EmbN", "mule", **without)),
        Row("MULE + NC", models("MULE + NC", "mule-nc", **{**without, "loss.nc": True})),
        Row("MULE + NC + LC", models("MULE + NC + LC", "mule-nc-lc", **{**without, "loss.nc": True, "loss.lc": True})),
        Row("MULE + NC + LC + LP (full)", models("MULE full", "mule-full", **mule)),
    ]  # fmt: skip
    if not with_mt:
        return rows
    mt = {"data.captions": "human+mt"}
    return rows + [
        Row("EmbN + MT", [m for lang in languages for m in models(
            f"EmbN {lang} + MT", f"embn-{lang}-mt", **without, **mt, **{"model.sharing": "parallel", "data.languages": lang})]),
        Row("PARALLEL-EmbN + MT", models("PARALLEL-EmbN + MT", "parallel-mt", **without, **mt, **{"model.sharing": "parallel"})),
        Row("MULE full + MT", models("MULE full + MT", "mule-full-mt", **mule, **mt)),
        Row("MULE full, MT only", models("MULE full, MT only", "mule-full-mt-only", **mule, **{"data.captions": "mt"})),
    ]  # fmt: skip


def english_models(models: list[Model]) -> list[str]:
    """The English EmbN models of the grid, one per seed: translate-the-query's models."""
    return [m.overrides["train.model_name"] for m in models
            if m.overrides.get("data.languages") == "en" and "data.captions" not in m.overrides]  # fmt: skip


def _average(result: RowResult, per_language: dict[str, list[float]], seeds: int) -> None:
    result.mr = {lang: statistics.fmean(v) for lang, v in per_language.items()}
    if seeds > 1:
        result.std = {lang: statistics.stdev(v) for lang, v in per_language.items()}
    result.seeds = seeds


def row_result(row: Row, evaluations: list[dict], trainings: list[dict]) -> RowResult:
    """One row from its models' evaluations; a language's mR is averaged over seeds, and the
    parameters are those of one seed's models."""
    result = RowResult(row.name, note=row.note)
    per_language: dict[str, list[float]] = {}
    seeds = {m.overrides["train.seed"] for m in row.models}
    for model, evaluation, training in zip(row.models, evaluations, trainings):
        for lang, r in evaluation["table"].items():
            per_language.setdefault(lang, []).append(r["mR"])
        if model.overrides["train.seed"] == min(seeds):
            result.parameters += training["parameters"]["total"]
            result.language_specific += training["parameters"]["language_specific"]
    _average(result, per_language, len(seeds))
    return result


def translated_query_row(results: list[dict]) -> RowResult:
    """The translate-the-query row: the English models' mR per query language (over seeds)."""
    per_language: dict[str, list[float]] = {}
    for result in results:
        for lang, row in result["table"].items():
            per_language.setdefault(lang, []).append(row["mR"])
    row = RowResult("Translate the query (EmbN en + lexicon)",
                    note="lexicons: " + ", ".join(f"en-{lang}" for lang in results[0]["languages"]),
                    parameters=results[0]["parameters"]["total"],
                    language_specific=results[0]["parameters"]["language_specific"])  # fmt: skip
    _average(row, per_language, len(results))
    return row


def _status(result: dict) -> str:
    return "reused" if result.get("reused") else "ran"


def ablation(runner: Runner, cfg: MuleConfig, parent_run_id: str | None) -> dict[str, Any]:
    """Every row's models: LP (when on), training and evaluation, each reused when its key
    is unchanged; then translate-the-query on the English models; then the table."""
    wd = runner.workdir
    seeds = [cfg.train.seed + i for i in range(cfg.ablation.seeds)]
    with_mt = Catalog(wd).has_table("captions", f"{cfg.data.dataset}.mt")  # the translate stage ran
    rows, steps, english = [], {}, []
    with tracking.run(wd, cfg, "ablation", parent_run_id) as run_id:
        for row in grid(list(cfg.data.languages), seeds, with_mt):
            evaluations, trainings = [], []
            for model in row.models:
                variant = apply_overrides(cfg, model.overrides)
                with tracking.run(wd, variant, f"ablation: {model.label}", run_id) as child:
                    if variant.pretrain.enabled:
                        steps[f"{model.label}: pretrain"] = _status(runner.run(variant, "pretrain", child))
                    trainings.append(runner.run(variant, "train", child))
                    evaluations.append(runner.run(variant, "evaluate", child))
                steps[f"{model.label}: train"] = _status(trainings[-1])
                steps[f"{model.label}: evaluate"] = _status(evaluations[-1])
            rows.append(row_result(row, evaluations, trainings))
            english += english_models(row.models)
        if english:
            translated = []
            with tracking.run(wd, cfg, "ablation: translate the query", run_id) as child:
                for name in english:
                    result = runner.run(apply_overrides(cfg, {"train.model_name": name}), "query-translation", child)
                    steps[f"{name}: query-translation"] = _status(result)
                    translated.append(result)
            if translated[0]["languages"]:  # there were lexicons
                rows.insert(1, translated_query_row(translated))
        return publish.ablation_report(wd, cfg, rows, run_id) | {"steps": steps}


def add_language(runner: Runner, cfg: MuleConfig, parent_run_id: str | None) -> dict[str, Any]:
    """A model trained without train.add_language, that language added to it (only its
    branch trains), and the model trained on every language from scratch; each evaluated."""
    from tasks.add_language import added_model_name, base_model_name

    wd, lang = runner.workdir, cfg.train.add_language
    if not lang:
        raise ConfigError("add-language needs a language: mule run add-language --lang ja (train.add_language)")
    others = [x for x in cfg.data.languages if x != lang]
    if not others:
        raise ConfigError(f"data.languages {list(cfg.data.languages)} has no language besides {lang} to start from")
    base_name, added_name = base_model_name(lang, cfg.train.base_model), added_model_name(lang, cfg.train.base_model)
    variants = {
        f"without {lang}": ({"data.languages": ",".join(others), "train.model_name": base_name,
                             "train.add_language": ""}, ("pretrain", "train")),
        f"without {lang}, then {lang} added": ({"train.model_name": added_name}, ("extend",)),
        "every language from scratch": ({"train.model_name": "model", "train.add_language": ""}, ("pretrain", "train")),
    }  # fmt: skip
    rows, steps = {}, {}
    with tracking.run(wd, cfg, f"add-language {lang}", parent_run_id) as run_id:
        for label, (overrides, training) in variants.items():
            variant = apply_overrides(cfg, overrides)
            with tracking.run(wd, variant, f"add-language: {label}", run_id) as child:
                for step in training:
                    if step == "pretrain" and not variant.pretrain.enabled:
                        continue
                    trained = runner.run(variant, step, child)
                    steps[f"{label}: {step}"] = _status(trained)
                evaluation = runner.run(variant, "evaluate", child)
                steps[f"{label}: evaluate"] = _status(evaluation)
            rows[label] = {"train": trained, "evaluation": evaluation}
        return publish.add_language_report(wd, cfg, lang, rows, run_id) | {"steps": steps}


def run_sweep(name: str, runner: Runner, cfg: MuleConfig, parent_run_id: str | None) -> dict[str, Any]:
    from .declaration import BY_NAME

    return BY_NAME[name].load_sweep()(runner, cfg, parent_run_id)

