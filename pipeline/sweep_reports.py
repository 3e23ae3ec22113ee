"""The sweeps' reports: the ablation's table (the paper's Table 2) and an addition's (the
base beside the model with the added languages, or the three-model study), written to
results/<dataset>/ and logged on the sweep's MLflow run. Like pipeline.publish, outside
every stage's key."""

from __future__ import annotations

import logging
from typing import Any

from mule.config.sections import MuleConfig
from mule.experiments import plots
from mule.experiments.report import ablation_markdown, to_csv
from mule.experiments.tracking import Tracker
from mule.storage.atomic import write_text_atomic
from mule.storage.workdir import Workdir


def ablation_report(wd: Workdir, cfg: MuleConfig, rows: list, run_id: str | None) -> dict[str, Any]:
    """The ablation's table (markdown, CSV, grouped bars) in results/<dataset>/ablation and on its run."""
    languages = [lang for lang in cfg.data.languages if any(lang in r.mr for r in rows)]
    markdown = ablation_markdown(rows, languages)
    records = [{"model": r.name, **{lang: round(r.mr[lang], 2) for lang in languages if lang in r.mr},
                **{f"{lang}_std": round(r.std[lang], 2) for lang in languages if lang in r.std},
                "mean": round(r.mean, 2), "mean_std": None if r.mean_std is None else round(r.mean_std, 2),
                "seeds": r.seeds, "baseline": r.baseline,
                "difference": None if r.difference is None else round(r.difference.mean, 2),
                "difference_spread": None if r.difference is None or r.difference.spread is None
                else round(r.difference.spread, 2),
                "verdict": "" if r.difference is None else r.difference.verdict,
                "parameters": r.parameters, "language_specific": r.language_specific,
                "val_mR": None if r.val is None else round(r.val, 2),
                "training_minutes": None if r.minutes is None else round(r.minutes, 2), "note": r.note}
               for r in rows]  # fmt: skip
    out = wd.results_dir(cfg.data.dataset) / "ablation"
    out.mkdir(parents=True, exist_ok=True)
    seeds = max(r.seeds for r in rows)
    header = f"mR per language, {cfg.data.dataset} {cfg.eval.split}" + (
        f", mean ± std over {seeds} seeds; a difference is a gain or a loss only when every seed"
        " moves the same way by more than the differences' spread"
        if seeds > 1
        else ""
    )
    write_text_atomic(f"{header}\n\n{markdown}\n", out / "ablation.md")
    write_text_atomic(to_csv(records), out / "ablation.csv")
    figure = plots.ablation_bars(rows, languages, f"{cfg.data.dataset} {cfg.eval.split}: mR per language and model")
    plots.save(figure, out / "ablation.png")
    plots.close(figure)
    tracker = Tracker(wd, run_id)
    for name in ("ablation.png", "ablation.md", "ablation.csv"):
        tracker.artifact(out / name)
    tracker.metrics({f"ablation.{r.name}.{lang}.mR": v for r in rows for lang, v in r.mr.items()})
    logging.getLogger("mule.pipeline").info("ablation (%s, %s):\n%s", cfg.data.dataset, cfg.eval.split, markdown)
    return {"markdown": markdown, "rows": records, "results_dir": str(out)}


def add_language_report(wd: Workdir, cfg: MuleConfig, lang: str, rows: dict, run_id: str | None) -> dict[str, Any]:
    """Test mR per language of the three models (without the language, with it added, from
    scratch), what each trained and how long; in results/<dataset>/add-language-<lang>.md."""
    languages = list(cfg.data.languages)
    lines = [f"| model | {' | '.join(languages)} | trained parameters | seconds |",
             "|---|" + "---|" * (len(languages) + 2)]  # fmt: skip
    for label, row in rows.items():
        table, trained = row["evaluation"]["table"], row["train"]
        cells = [f"{table[x]['mR']:.1f}" if x in table else "–" for x in languages]
        if trained is None:  # add.base_model: a model trained before, measured as it is
            lines.append(f"| {label} ({cfg.add.base_model}, trained before) | {' | '.join(cells)} | – | – |")
            continue
        parameters = trained.get("trainable_parameters") or trained["parameters"]["total"]
        seconds = "reused" if trained.get("reused") else trained.get("seconds", "")
        lines.append(f"| {label} | {' | '.join(cells)} | {parameters:,} | {seconds} |")
    chance = {}  # the three models are measured on the same test images and sentences of their languages
    for row in rows.values():
        chance |= row["evaluation"].get("chance", {})
    if chance:
        cells = [f"{chance[x]['mR']:.1f}" if x in chance else "–" for x in languages]
        lines.append(f"| chance (a random ranking) | {' | '.join(cells)} | – | – |")
    added = rows[f"without {lang}, then {lang} added"]["train"]
    change = added["existing_languages_max_change"]
    markdown = "\n".join(lines) + f"\n\nBase languages' embeddings after adding {lang}: largest change {change:g}.\n"
    if "lp_images" in added:
        markdown += (f"{lang} trained on {added['images']} photographed training images; its LP on "
                     f"{added['lp_images']} (sentences alone: photographed or not).\n")  # fmt: skip
    out = wd.results_dir(cfg.data.dataset) / f"add-language-{lang}.md"
    write_text_atomic(markdown, out)
    Tracker(wd, run_id).artifact(out)
    logging.getLogger("mule.pipeline").info("adding %s (test mR per language):\n%s", lang, markdown)
    return {"rows": {k: v["evaluation"]["table"] for k, v in rows.items()}, "markdown": markdown,
            "existing_languages_max_change": change, "report": str(out),
            "images": {"joint": added.get("images"), "lp": added.get("lp_images")}}  # fmt: skip


def added_languages_report(wd: Workdir, cfg: MuleConfig, base: dict, final: dict, added: dict[str, dict],
                           base_name: str, final_name: str, run_id: str | None,
                           translated: dict | None = None) -> dict[str, Any]:  # fmt: skip
    """Languages added to a trained model: test mR per language of the base and of the model
    with them, chance beside; per added language, the captions it read and what it trained.
    In results/<dataset>/add-language-<langs>.md and on the sweep's run."""
    languages = list(dict.fromkeys([*final["table"], *base["table"]]))
    split = final.get("split", cfg.eval.split)
    lines = [f"| model (test mR, {split}) | {' | '.join(languages)} |", "|---|" + "---|" * len(languages)]
    for name, evaluation in ((f"{base_name}, as trained", base), (final_name, final)):
        table = evaluation["table"]
        lines.append(f"| {name} | " + " | ".join(f"{table[x]['mR']:.1f}" if x in table else "–" for x in languages) + " |")
    if translated and len(translated["table"]) > 1:  # the added languages' queries, by a dictionary instead
        row = translated["table"]
        lines.append(f"| {base_name}'s English branch, queries translated into en word by word | " + " | ".join(
            f"{row[x]['mR']:.1f}" if x in row and x in cfg.add.added else "–" for x in languages) + " |")  # fmt: skip
    chance = {**base.get("chance", {}), **final.get("chance", {})}
    if chance:
        lines.append("| chance (a random ranking) | " + " | ".join(f"{chance[x]['mR']:.1f}" if x in chance else "–"
                                                               for x in languages) + " |")  # fmt: skip
    untested = [lang for lang in added if lang not in final["table"]]
    notes = []
    for lang, steps in added.items():
        extend, captions = steps["extend"], steps.get("captions") or {}
        per_split = captions.get("per_split") or {}
        read = (", ".join(f"{n} {s}" for s, n in sorted(per_split.items())) + " captions") if per_split else "no caption"
        trained = ("nothing trained: its aligned start, read zero-shot" if not extend.get("history") else
                   f"joint epoch {extend['best_epoch']} kept" + (f" (val {extend['val_captions']} captions)"
                                                                 if extend.get("val_captions") else " (the last: no "
                                                                 "validation captions)"))  # fmt: skip
        seconds = "reused" if extend.get("reused") else f"{extend.get('seconds', 0):.0f} s"
        notes.append(f"- {lang}: {read}; {trained}; its branch {extend['trainable_parameters']:,} parameters, "
                     f"{extend.get('branch_bytes', 0) / 2**20:.1f} MiB stored; {seconds}; base weights and "
                     f"embeddings unchanged (largest change {extend['existing_languages_max_change']:g})")  # fmt: skip
    if translated and len(translated["table"]) > 1:
        notes += [f"- translated queries, {lang}: {translated['tables'][lang]}" for lang in translated["languages"]]
    markdown = "\n".join(lines) + "\n\n" + "\n".join(notes) + "\n"
    if untested:
        markdown += (f"\n{', '.join(untested)}: no test captions, so no test figure (the model reads "
                     f"{'them' if len(untested) > 1 else 'it'}: mule search, mule serve).\n")  # fmt: skip
    out = wd.results_dir(cfg.data.dataset) / f"add-language-{'-'.join(cfg.add.added)}.md"
    write_text_atomic(markdown, out)
    Tracker(wd, run_id).artifact(out)
    logging.getLogger("mule.pipeline").info("adding %s (test mR per language):\n%s", cfg.add.languages, markdown)
    rows = {base_name: base["table"], final_name: final["table"]}
    if translated:
        rows["translated queries"] = {x: row for x, row in translated["table"].items() if x in cfg.add.added}
    return {"rows": rows, "markdown": markdown, "report": str(out),
            "model": final_name, "existing_languages_max_change": max(
                (steps["extend"]["existing_languages_max_change"] for steps in added.values()), default=0.0)}  # fmt: skip
