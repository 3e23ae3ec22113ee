"""The ablation grid, the structure of the paper's Table 2: baselines and MULE's parts,
each trained and evaluated the same way, each as a child of one MLflow run.

Rows are data (`grid`): a row names the models behind it and their config overrides.
Rows for machine-translated training data (Table 4) slot in as more rows once the
translation stage exists: a row with a data-selection override.
"""

from __future__ import annotations

import functools
import statistics
from dataclasses import dataclass, field
from typing import Any

from prefect import task
from prefect.cache_policies import NO_CACHE

from data_catalog import queries
from data_catalog.catalog import write_text_atomic
from data_catalog.datasets import locate
from data_catalog.lexicons import english_lexicons
from experiments import plots
from experiments.report import to_csv
from experiments.tracking import Tracker
from mule_core.text import Vocab, translate_tokens, word_translator
from mule_core.training import evaluate_split, resolve_device

from .common import context, logger
from .features import extractor_for
from .model_io import Vocabulary, load_model, load_split

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
                     {**overrides, "train.seed": seed, "train.model_name": model_name(f"{slug}{suffix}"),
                      "train.reuse": True})  # fmt: skip

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


@task(name="ablation-inputs", cache_policy=NO_CACHE)
def missing_inputs(workdir: str, config: dict[str, Any]) -> list[str]:
    """The stages whose outputs the ablation needs and the workdir lacks (or holds for
    another setting: an LP model of other dimensions is redone)."""
    wd, catalog, cfg = context(workdir, config)
    dataset, missing = cfg.data.dataset, []
    if not catalog.has_table("captions", dataset):
        return ["ingest", "features", "text", "pretrain"]
    if not catalog.feature_parts(dataset, extractor_for(cfg.features)):
        missing.append("features")
    if not catalog.has_table("word_vectors", dataset):
        return [*missing, "text", "pretrain"]
    lp = wd.lp_model_path(dataset)
    if not lp.exists():
        missing.append("pretrain")
    else:
        try:
            stored = load_model(lp)[1]["cfg"]
        except (RuntimeError, KeyError, ValueError) as error:  # written by another version of mule
            logger().info("LP model %s is not usable here (%s); it will be redone", lp, str(error).splitlines()[0])
            missing.append("pretrain")
        else:
            if (stored.model, stored.pretrain, stored.text) != (cfg.model, cfg.pretrain, cfg.text):
                missing.append("pretrain")
    return missing


@task(name="ablation-lp-inputs", cache_policy=NO_CACHE)
def missing_lp_models(workdir: str, config: dict[str, Any], rows: list[Row]) -> list[str]:
    """The caption selections (data.captions) whose LP model rows need and the workdir
    lacks: LP on human + MT captions is its own model (Workdir.lp_model_path)."""
    wd, _, cfg = context(workdir, config)
    needed = {m.overrides.get("data.captions", cfg.data.captions) for row in rows for m in row.models
              if m.overrides.get("pretrain.enabled", cfg.pretrain.enabled)}  # fmt: skip
    return sorted(c for c in needed if not wd.lp_model_path(cfg.data.dataset, c).exists())


class _TranslatingVocab(Vocab):
    """The English vocabulary, reading sentences translated word by word into English."""

    def __init__(self, english: Vocab, table: dict[str, str]):
        super().__init__(english.tokens)
        self.table = table

    def encode(self, tokens):
        return super().encode(translate_tokens(tokens, self.table))


@task(name="translate-the-query", cache_policy=NO_CACHE)
def translate_the_query(
    workdir: str, config: dict[str, Any], run_id: str | None, english_models: list[str]
) -> RowResult | None:
    """Non-English test queries translated into English word by word (bilingual lexicons)
    and run through the English-only models (one per seed)."""
    wd, catalog, cfg = context(workdir, config)
    log, dataset, tracker = logger(), cfg.data.dataset, Tracker(wd, run_id)
    folder = cfg.data.dictionaries or str(locate(wd, cfg.data).root / "dictionaries")
    languages = [lang for lang in cfg.data.languages if lang != "en"]
    lexicons = english_lexicons(folder, languages)
    if not lexicons:
        log.warning("no en-<lang>.txt lexicons in %s: the translate-the-query row is left out", folder)
        return None
    counts = queries.training_word_counts(catalog, dataset, "en")
    reader = functools.partial(catalog.read_features, dataset)
    device = resolve_device(cfg.train.device)
    per_language: dict[str, list[float]] = {}
    result = RowResult("Translate the query (EmbN en + lexicon)",
                       note="lexicons: " + ", ".join(f"en-{lang}" for lang in lexicons))  # fmt: skip
    for english_model in english_models:
        model, meta = load_model(wd.model_path(dataset, english_model))
        english: Vocab = meta["vocabulary"].vocabs["en"]
        result.parameters, result.language_specific = (meta["parameters"]["total"],
                                                       meta["parameters"]["language_specific"])  # fmt: skip
        for lang in ["en", *lexicons]:
            vocab = english if lang == "en" else _TranslatingVocab(english, word_translator(lexicons[lang], counts))
            data = load_split(catalog, dataset, cfg.eval.split, Vocabulary([lang], {lang: vocab}),
                              meta["cfg"].text.max_tokens, (meta["extractor"], reader))  # fmt: skip
            data.languages = ["en"]  # the English model reads the translated sentences
            per_language.setdefault(lang, []).append(evaluate_split(model, data, device, cfg.eval.ks)["en"]["mR"])
    _average(result, per_language, len(english_models))
    tracker.metrics({f"test.{lang}.mR": v for lang, v in result.mr.items()})
    tracker.params({"translate.lexicons": folder, "translate.english_models": ", ".join(english_models)})
    return result


def english_models(models: list[Model]) -> list[str]:
    """The English EmbN models of the grid, one per seed: translate-the-query's models."""
    return [m.overrides["train.model_name"] for m in models
            if m.overrides.get("data.languages") == "en" and "data.captions" not in m.overrides]  # fmt: skip


def _average(result: RowResult, per_language: dict[str, list[float]], seeds: int) -> None:
    result.mr = {lang: statistics.fmean(v) for lang, v in per_language.items()}
    if seeds > 1:
        result.std = {lang: statistics.stdev(v) for lang, v in per_language.items()}
    result.seeds = seeds


def _cell(row: RowResult, lang: str) -> str:
    if lang not in row.mr:
        return "–"
    return f"{row.mr[lang]:.1f} ± {row.std[lang]:.1f}" if lang in row.std else f"{row.mr[lang]:.1f}"


def ablation_markdown(rows: list[RowResult], languages: list[str]) -> str:
    head = "| model | " + " | ".join(languages) + " | mean | parameters | language-specific |"
    lines = [head, "|" + "---|" * (len(languages) + 4)]
    for row in rows:
        cells = [row.name] + [_cell(row, lang) for lang in languages]
        mean = sum(row.mr.values()) / len(row.mr) if row.mr else float("nan")
        cells += [f"{mean:.1f}", f"{row.parameters:,}", f"{row.language_specific:,}"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


@task(name="ablation-table", cache_policy=NO_CACHE)
def summarize(workdir: str, config: dict[str, Any], run_id: str | None, rows: list[RowResult]) -> dict[str, Any]:
    wd, _, cfg = context(workdir, config)
    languages = [lang for lang in cfg.data.languages if any(lang in r.mr for r in rows)]
    markdown = ablation_markdown(rows, languages)
    records = [{"model": r.name, **{lang: round(r.mr[lang], 2) for lang in languages if lang in r.mr},
                **{f"{lang}_std": round(r.std[lang], 2) for lang in languages if lang in r.std},
                "mean": round(sum(r.mr.values()) / max(len(r.mr), 1), 2), "seeds": r.seeds,
                "parameters": r.parameters, "language_specific": r.language_specific, "note": r.note}
               for r in rows]  # fmt: skip
    out = wd.results_dir(cfg.data.dataset) / ABLATION_DIR
    out.mkdir(parents=True, exist_ok=True)
    seeds = max(r.seeds for r in rows)
    header = f"mR per language, {cfg.data.dataset} {cfg.eval.split}" + (
        f", mean ± std over {seeds} seeds" if seeds > 1 else ""
    )
    write_text_atomic(f"{header}\n\n{markdown}\n", out / "ablation.md")
    write_text_atomic(to_csv(records), out / "ablation.csv")
    figure = plots.ablation_bars(rows, languages, f"{cfg.data.dataset} {cfg.eval.split}: mR per language and model")
    plots.save(figure, out / "ablation.png")
    tracker = Tracker(wd, run_id)
    tracker.artifact(out / "ablation.png")
    plots.close(figure)
    for name in ("ablation.md", "ablation.csv"):
        tracker.artifact(out / name)
    tracker.metrics({f"ablation.{r.name}.{lang}.mR": v for r in rows for lang, v in r.mr.items()})
    logger().info("ablation (%s, %s):\n%s", cfg.data.dataset, cfg.eval.split, markdown)
    return {"markdown": markdown, "rows": records, "results_dir": str(out)}


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
