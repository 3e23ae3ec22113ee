"""Sweeps: the ablation (the paper's Table 2, and Table 4's MT rows) and adding a language.

A sweep is data: its variants, each a label, a config and the declared stages it runs in
order (`Variant`), and a report made from their results. `run_sweep` runs every variant's
stages through the one runner (pipeline.runner), so every ablation model and every added
language is decided by the stage's key for its config, one record per model name, exactly
as the rebuild's own train stage is: a rerun with nothing changed trains nothing, and
(`decide_steps`) does not even start Prefect. Rows of the ablation are data too (`grid`).

What the sweeps need from the rebuild (captions, features, word vectors) comes from the
rebuild itself: `mule run ablation` runs the stages that write it first
(pipeline.declaration.upstream), reused when they are up to date.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from mule.config.overrides import apply_overrides
from mule.config.sections import MuleConfig, caption_file
from mule.data_catalog.tables import Catalog
from mule.experiments import tracking
from mule.experiments.seeds import Difference, paired_difference
from mule.mule_core.settings import ConfigError
from mule.pipeline import decisions, sweep_reports
from mule.pipeline.runner import Runner
from mule.storage.workdir import Workdir

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
    baseline: str = ""  # the row it is compared with, seed by seed: what switching one thing on adds


@dataclass
class RowResult:
    name: str
    mr: dict[str, float] = field(default_factory=dict)  # language -> mR (mean over seeds)
    parameters: int = 0
    language_specific: int = 0
    note: str = ""
    std: dict[str, float] = field(default_factory=dict)  # language -> std over seeds (several seeds only)
    seeds: int = 1
    by_seed: dict[int, float] = field(default_factory=dict)  # seed -> mR averaged over the languages
    baseline: str = ""
    difference: Difference | None = None  # from the baseline row, paired by seed (experiments/seeds.py)
    val: float | None = None  # the models' best validation mean mR (their mean), over seeds
    minutes: float | None = None  # training one seed's models took: LP and joint, over seeds

    @property
    def mean(self) -> float:
        return statistics.fmean(self.by_seed.values()) if self.by_seed else statistics.fmean(self.mr.values())

    @property
    def mean_std(self) -> float | None:
        return statistics.stdev(self.by_seed.values()) if len(self.by_seed) > 1 else None


def model_name(slug: str) -> str:
    return f"{ABLATION_DIR}/{slug}"


def grid(languages: list[str], seeds: list[int] | None = None, with_mt: bool = False) -> list[Row]:
    """The rows of the ablation, in the paper's order; with several seeds, each row holds
    its models once per seed (the first seed keeps the plain names). with_mt (the translate
    stage has run): Table 4's rows too, trained on human + machine-translated captions, and
    MULE on MT only (English human captions, the other languages only as translations)."""
    seeds = seeds or [0]
    # Table 2's rows train on human captions whatever the preset reads (some-photos: human+mt)
    without = {"loss.nc": False, "loss.lc": False, "pretrain.enabled": False, "data.captions": "human"}

    def one_seed(label: str, slug: str, seed: int, overrides: dict[str, Any]) -> Model:
        suffix = "" if seed == seeds[0] else f"-s{seed}"
        return Model(f"{label}{f' (seed {seed})' if suffix else ''}", f"{slug}{suffix}",
                     {**overrides, "train.seed": seed, "output.model_name": model_name(f"{slug}{suffix}")})  # fmt: skip

    def models(label: str, slug: str, **overrides: Any) -> list[Model]:
        return [one_seed(label, slug, seed, overrides) for seed in seeds]

    mule = {"loss.nc": True, "loss.lc": True, "pretrain.enabled": True, "data.captions": "human"}
    embn, parallel, full = "EmbN (one model per language)", "PARALLEL-EmbN", "MULE + NC + LC + LP (full)"
    rows = [
        Row(embn,
            [m for lang in languages
             for m in models(f"EmbN {lang}", f"embn-{lang}", **without, **{"model.sharing": "parallel", "data.languages": lang})]),
        Row(parallel, models("PARALLEL-EmbN", "parallel", **without, **{"model.sharing": "parallel"}), baseline=embn),
        Row("MULE EmbN", models("MULE EmbN", "mule", **without), baseline=parallel),
        Row("MULE + NC", models("MULE + NC", "mule-nc", **{**without, "loss.nc": True}), baseline="MULE EmbN"),
        Row("MULE + NC + LC", models("MULE + NC + LC", "mule-nc-lc", **{**without, "loss.nc": True, "loss.lc": True}),
            baseline="MULE + NC"),
        Row(full, models("MULE full", "mule-full", **mule), baseline="MULE + NC + LC"),
    ]  # fmt: skip
    if not with_mt:
        return rows
    mt = {"data.captions": "human+mt"}
    return rows + [
        Row("EmbN + MT", [m for lang in languages for m in models(
            f"EmbN {lang} + MT", f"embn-{lang}-mt", **{**without, **mt, "model.sharing": "parallel", "data.languages": lang})],
            baseline=embn),
        Row("PARALLEL-EmbN + MT", models("PARALLEL-EmbN + MT", "parallel-mt", **{**without, **mt, "model.sharing": "parallel"}),
            baseline=parallel),
        Row("MULE full + MT", models("MULE full + MT", "mule-full-mt", **{**mule, **mt}), baseline=full),
        Row("MULE full, MT only", models("MULE full, MT only", "mule-full-mt-only", **{**mule, "data.captions": "mt"}),
            baseline=full),
    ]  # fmt: skip


def english_models(models: list[Model]) -> list[Model]:
    """The English EmbN models of the grid, one per seed: translate-the-query's models."""
    return [m for m in models if m.overrides.get("data.languages") == "en" and m.overrides["data.captions"] == "human"]


def _average(result: RowResult, per_language: dict[str, dict[int, float]]) -> None:
    """per_language: language -> seed -> mR."""
    result.mr = {lang: statistics.fmean(v.values()) for lang, v in per_language.items()}
    seeds = sorted({s for v in per_language.values() for s in v})
    if len(seeds) > 1:
        result.std = {lang: statistics.stdev(v.values()) for lang, v in per_language.items()}
    result.seeds = len(seeds)
    result.by_seed = {s: statistics.fmean(v[s] for v in per_language.values() if s in v) for s in seeds}


def row_result(name: str, models: list[tuple[MuleConfig, dict, dict]], note: str = "") -> RowResult:
    """One row from its models' (config, training, evaluation): a language's mR is averaged
    over seeds, and the parameters are those of one seed's models. Training's "seconds"
    (and "lp_seconds", its LP's) give the row's minutes a seed; "val_mean_mR" its val."""
    result = RowResult(name, note=note)
    per_language: dict[str, dict[int, float]] = {}
    seeds = {cfg.train.seed for cfg, _, _ in models}
    vals, seconds = [], 0.0
    for cfg, training, evaluation in models:
        for lang, r in evaluation["table"].items():
            per_language.setdefault(lang, {})[cfg.train.seed] = r["mR"]
        if cfg.train.seed == min(seeds):
            result.parameters += training["parameters"]["total"]
            result.language_specific += training["parameters"]["language_specific"]
        if training.get("val_mean_mR") is not None:
            vals.append(training["val_mean_mR"])
        seconds += training.get("seconds", 0.0) + training.get("lp_seconds", 0.0)
    _average(result, per_language)
    result.val = statistics.fmean(vals) if vals else None
    result.minutes = seconds / 60 / len(seeds) if seconds else None
    return result


def compare(rows: list[RowResult], baselines: dict[str, str]) -> list[RowResult]:
    """Each row's difference from its baseline row (row name -> baseline name), paired by
    seed on the mean over languages."""
    by_name = {r.name: r for r in rows}
    for row in rows:
        base = by_name.get(baselines.get(row.name, ""))
        if base is not None and row.by_seed and base.by_seed:
            row.baseline, row.difference = base.name, paired_difference(row.by_seed, base.by_seed)
    return rows


def translated_query_row(results: list[tuple[int, dict]]) -> RowResult:
    """The translate-the-query row from (seed, result) of each English model: mR per query
    language (over seeds)."""
    per_language: dict[str, dict[int, float]] = {}
    for seed, result in results:
        for lang, row in result["table"].items():
            per_language.setdefault(lang, {})[seed] = row["mR"]
    results = [result for _, result in results]
    row = RowResult(TRANSLATED,
                    note="word tables: " + ", ".join(f"{lang}->en {results[0].get('tables', {}).get(lang, 'lexicon')}"
                                                     .split(":")[0] for lang in results[0]["languages"]),
                    parameters=results[0]["parameters"]["total"],
                    language_specific=results[0]["parameters"]["language_specific"])  # fmt: skip
    _average(row, per_language)
    return row


# -- sweeps as data -----------------------------------------------------------------------


@dataclass(frozen=True)
class Variant:
    """One model of a sweep: its label (its MLflow run: "<sweep>: <label>"), its config, the
    declared stages it runs, in order, and the report's row it belongs to."""

    label: str
    cfg: MuleConfig
    steps: tuple[str, ...]
    row: str = ""


@dataclass(frozen=True)
class Sweep:
    title: Callable[[MuleConfig], str]  # the sweep's MLflow run
    variants: Callable[[Workdir, MuleConfig], list[Variant]]
    # (workdir, config, variants, results: label -> step -> result, run id) -> the summary
    report: Callable[[Workdir, MuleConfig, list[Variant], dict, str | None], dict]


TRANSLATED = "Translate the query (EmbN en + word table)"
CHANCE = "chance (a random ranking of the same images and sentences)"


# The order rows train in, the answer most wanted first (a run stopped halfway has the full
# model and what each of its parts adds); the report keeps the paper's order (`grid`).
RUN_ORDER = ("MULE + NC + LC + LP (full)", "MULE + NC + LC", "MULE + NC", "MULE EmbN", "PARALLEL-EmbN",
             "EmbN (one model per language)", "MULE full + MT", "PARALLEL-EmbN + MT", "EmbN + MT",
             "MULE full, MT only")  # fmt: skip


def _ablation_variants(wd: Workdir, cfg: MuleConfig) -> list[Variant]:
    """Every row's models (LP when on, training, evaluation) in RUN_ORDER, then
    translate-the-query on each English model."""
    seeds = [cfg.train.seed + i for i in range(cfg.ablation.seeds)]
    with_mt = Catalog(wd).has_table("captions", f"{cfg.data.dataset}.mt")  # the translate stage ran
    variants, english = [], []
    rows = grid(list(cfg.data.languages), seeds, with_mt)
    for row in sorted(rows, key=lambda r: RUN_ORDER.index(r.name)):
        for model in row.models:
            variant = apply_overrides(cfg, model.overrides)
            steps = (("pretrain",) if variant.pretrain.enabled else ()) + ("train", "evaluate")
            variants.append(Variant(model.label, variant, steps, row.name))
        english += english_models(row.models)
    variants += [Variant(f"translate the query with {m.label}",
                         apply_overrides(cfg, {"output.model_name": m.overrides["output.model_name"],
                                               "train.seed": m.overrides["train.seed"]}),
                         ("query-translation",), TRANSLATED) for m in english]  # fmt: skip
    return variants


def _ablation_report(wd: Workdir, cfg: MuleConfig, variants: list[Variant], results: dict,
                     run_id: str | None) -> dict[str, Any]:  # fmt: skip
    paper = [row.name for row in grid(list(cfg.data.languages), with_mt=True)] + [TRANSLATED]
    rows: dict[str, list] = {}
    for v in sorted(variants, key=lambda v: paper.index(v.row)):  # the paper's order (sorted keeps a row's seeds)
        rows.setdefault(v.row, []).append(v)
    def training(v: Variant) -> dict:  # joint training's result, with its LP's time
        return results[v.label]["train"] | {"lp_seconds": results[v.label].get("pretrain", {}).get("seconds", 0.0)}

    table = [row_result(name, [(v.cfg, training(v), results[v.label]["evaluate"]) for v in models])
             for name, models in rows.items() if name != TRANSLATED]  # fmt: skip
    translated = [(v.cfg.train.seed, results[v.label]["query-translation"]) for v in rows.get(TRANSLATED, [])]
    if translated and translated[0][1]["languages"]:  # there were lexicons
        table.insert(1, translated_query_row(translated))
    baselines = {row.name: row.baseline for row in grid(list(cfg.data.languages), with_mt=True)}
    baselines[TRANSLATED] = table[0].name  # the English EmbN model, every language one model
    compared = compare(table, baselines)
    chance = {}  # every row is measured on the same test images and sentences of its languages
    for v in variants:
        chance |= results[v.label].get("evaluate", {}).get("chance", {})
    if chance:
        compared.append(RowResult(CHANCE, mr={lang: row["mR"] for lang, row in chance.items()}))
    return sweep_reports.ablation_report(wd, cfg, compared, run_id)


def _add_language_variants(wd: Workdir, cfg: MuleConfig) -> list[Variant]:
    """Adding add.languages's languages to a trained model (declaration.adds_to_a_trained_model):
    the base measured as it is, each language's captions read and its branch added in turn
    (es onto the base, ja onto <base>+es: each branch trains as it would alone), and the
    model with all of them measured. The study of one language of data.languages instead: a
    model trained without it, that language added to it, and every language from scratch."""
    from mule.pipeline.declaration import adds_to_a_trained_model

    langs = cfg.add.added
    if not langs:
        raise ConfigError("add-language needs a language: mule run add-language --lang ja (add.languages)")
    if adds_to_a_trained_model(cfg):
        return _added_to_trained(wd, cfg, langs)
    (lang,) = langs
    others = [x for x in cfg.data.languages if x != lang]
    if not others:
        raise ConfigError(f"data.languages {list(cfg.data.languages)} has no language besides {lang} to start from")
    base_name, added_name = cfg.add.root_model, cfg.add.added_model
    lp = ("pretrain",) if cfg.pretrain.enabled else ()
    return [
        Variant(f"without {lang}", apply_overrides(cfg, {"data.languages": ",".join(others),
                "output.model_name": base_name, "add.languages": ""}), (*lp, "train", "evaluate")),
        Variant(f"without {lang}, then {lang} added", apply_overrides(cfg, {"output.model_name": added_name}),
                ("extend", "evaluate")),
        Variant("every language from scratch", apply_overrides(cfg, {"output.model_name": "model",
                "add.languages": ""}), (*lp, "train", "evaluate")),
    ]  # fmt: skip


def _added_to_trained(wd: Workdir, cfg: MuleConfig, langs: tuple[str, ...]) -> list[Variant]:
    root = cfg.add.base_model or cfg.output.model_name
    path = wd.model_path(cfg.data.dataset, root)
    if not path.is_file():
        named = f"add.base_model={root!r}" if cfg.add.base_model else f"the rebuild's model ({root!r})"
        raise ConfigError(f"{named}: no model at {path} to add {', '.join(langs)} to: train one first (mule run "
                          "all), or name one with --set add.base_model=NAME (models/<dataset>/NAME.pt)")  # fmt: skip
    variants = [Variant(f"{root}, as trained", apply_overrides(cfg, {"output.model_name": root, "add.languages": "",
                                                                    "add.base_model": "", "add.captions": ""}),
                        ("evaluate",), "base")]  # fmt: skip
    def files(named) -> str:  # the --captions tables of these languages (and those given for none)
        return ",".join(item for item in cfg.add.captions if caption_file(item)[0] in ("", *named))

    for n, lang in enumerate(langs, start=1):
        chain = {"add.base_model": root, "add.languages": ",".join(langs[:n]), "add.captions": files(langs[:n])}
        if lang not in cfg.data.languages:  # its captions: a table of their own
            variants.append(Variant(f"{lang}: its captions", apply_overrides(cfg, {**chain, "add.languages": lang,
                                                                                  "add.captions": files([lang])}),
                                    ("language-captions",), lang))  # fmt: skip
        named = apply_overrides(cfg, chain)
        variants.append(Variant(f"{lang} added to {named.add.extended_model}",
                                apply_overrides(cfg, {**chain, "output.model_name": named.add.added_model}),
                                ("extend",), lang))  # fmt: skip
    full = apply_overrides(cfg, {"add.base_model": root})
    final = apply_overrides(full, {"output.model_name": full.add.added_model})
    variants.append(Variant(f"{final.output.model_name}, measured", final, ("evaluate",), "added"))
    # beside it: the added languages' queries translated into English word by word, read by the base's English branch
    if "en" in cfg.data.languages:
        variants.append(Variant(f"{', '.join(langs)} queries translated into en for {root}",
                                apply_overrides(full, {"output.model_name": root}), ("query-translation",),
                                "translated"))  # fmt: skip
    return variants


def _add_language_report(wd: Workdir, cfg: MuleConfig, variants: list[Variant], results: dict,
                         run_id: str | None) -> dict[str, Any]:  # fmt: skip
    from mule.pipeline.declaration import adds_to_a_trained_model

    if adds_to_a_trained_model(cfg):
        base = next(v for v in variants if v.row == "base")
        final = next(v for v in variants if v.row == "added")
        steps = {v.row: results[v.label] for v in variants if v.row not in ("base", "added", "translated")}
        added = {lang: {"captions": results.get(f"{lang}: its captions", {}).get("language-captions"),
                        "extend": next(results[v.label]["extend"] for v in variants
                                       if v.row == lang and "extend" in v.steps)}
                 for lang in cfg.add.added if lang in steps}  # fmt: skip
        translated = next((results[v.label]["query-translation"] for v in variants if v.row == "translated"), None)
        return sweep_reports.added_languages_report(wd, cfg, results[base.label]["evaluate"],
                                              results[final.label]["evaluate"], added, base.cfg.output.model_name,
                                              final.cfg.output.model_name, run_id, translated)  # fmt: skip
    rows = {v.label: {"train": results[v.label].get("extend") or results[v.label].get("train"),
                      "evaluation": results[v.label]["evaluate"]} for v in variants}  # fmt: skip
    return sweep_reports.add_language_report(wd, cfg, cfg.add.languages, rows, run_id)


ABLATION = Sweep(lambda cfg: "ablation", _ablation_variants, _ablation_report)
ADD_LANGUAGE = Sweep(lambda cfg: f"add-language {cfg.add.languages}", _add_language_variants,
                     _add_language_report)  # fmt: skip


def _sweep(name: str) -> Sweep:
    from mule.pipeline.declaration import BY_NAME

    return BY_NAME[name].load_sweep()


def decide_steps(wd: Workdir, cfg: MuleConfig, name: str) -> dict[tuple[str, str], decisions.Decision] | None:
    """Every step of every variant decided, by (variant, step), when all are reused (then
    what one step writes and the next reads is unchanged, so deciding them all beforehand
    is deciding them in order); None as soon as one has to run."""
    decided = {}
    for v in _sweep(name).variants(wd, cfg):
        for step in v.steps:
            decision = decisions.decide(wd, v.cfg, step)
            if decision.run:
                return None
            decided[(v.label, step)] = decision
    return decided


def run_sweep(name: str, runner: Runner, cfg: MuleConfig, parent_run_id: str | None,
              decided: dict[tuple[str, str], decisions.Decision] | None = None) -> dict[str, Any]:  # fmt: skip
    """Every variant's steps, each decided once by its key (`decided`: decide_steps' when
    it found them all reused; an MLflow run per variant, a run per step inside it), then
    the sweep's report."""
    sweep, wd = _sweep(name), runner.workdir
    variants = sweep.variants(wd, cfg)
    results: dict[str, dict[str, dict]] = {}
    steps: dict[str, str] = {}
    with tracking.run(wd, cfg, sweep.title(cfg), parent_run_id) as run_id:
        for v in variants:
            with tracking.run(wd, v.cfg, f"{name}: {v.label}", run_id) as child:
                results[v.label] = {step: runner.run(v.cfg, step, child, decision=(decided or {}).get((v.label, step)))
                                    for step in v.steps}  # fmt: skip
            steps |= {
                f"{v.label}: {step}": "reused" if r.get("reused") else "ran" for step, r in results[v.label].items()
            }
        return sweep.report(wd, cfg, variants, results, run_id) | {"steps": steps}
