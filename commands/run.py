"""`mule demo` and `mule run`: stages, under the workdir's lock, through the one rebuild body
(pipeline.rebuild): planned and decided here, answered without Prefect when nothing has to
run, else handed (plan, decisions and all) to Prefect's rebuild flow."""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time

from mule.config.resolution import resolve
from mule.mule_core.settings import ConfigError
from mule.pipeline.declaration import BY_NAME, REBUILD
from mule.stopping import interrupts
from mule.storage.workdir import Workdir


def run(args: argparse.Namespace, stages: list[str], overrides: dict) -> int:
    """The stages named, with the config the preset and these overrides resolve to."""
    unknown = [s for s in args.force if s not in REBUILD]
    if unknown:
        raise ConfigError(f"--force {', '.join(unknown)}: not a stage; stages are: {', '.join(REBUILD)}")
    workdir = Workdir.at(args.workdir)
    photos = None if args.preset else photos_for_preset(workdir, overrides)
    cfg = resolve(args.preset, overrides, photos)  # config errors before Prefect starts
    if photos and args.preset is None and cfg.preset != "default":
        print(f"preset {cfg.preset}: {photos:,} photos (config/resolution.py: PHOTO_PRESETS; --preset NAME "
              f"takes another)", file=sys.stderr)  # fmt: skip
    if "ingest" in stages:
        from mule.data_catalog.sources import locate

        locate(workdir, cfg.data)  # a missing --source fails here, in milliseconds
    started = time.perf_counter()
    from mule.storage.locks import workdir_lock

    interrupts.install(_stopped_line(workdir, cfg, time.time()))
    # The lock before anything touches the workdir, Prefect's database included: a second
    # run is refused (or waits) before it starts a server of its own.
    with workdir_lock(workdir, "starting", wait=args.wait, waiting=_waiting_for(workdir)):
        from mule.experiments import relocation

        relocation.adopt(workdir)  # a copied or moved workdir becomes its own before anything runs
        from mule.pipeline import rebuild

        planned = rebuild.plan(workdir, cfg, stages, set(args.force))
        if os.environ.get("MULE_UP_TO_DATE_CHECK") != "0" and rebuild.decide_ahead(workdir, cfg, planned):
            from mule.pipeline.hooks import tracked

            results = rebuild.finish_unchanged(workdir, cfg, planned, tracked())
            print("every stage is up to date: nothing ran, and Prefect was not started (MLflow records the "
                  "reuse; --force STAGE runs one anyway)")  # fmt: skip
            print_results(results, workdir, started, args)
            return 0
        _prefect_ready(workdir)
        from mule.flows.prefect_server import start_prefect_early

        server = start_prefect_early()  # boots while the stages' modules import
        from mule.flows.stages import rebuild_flow

        if server:
            server.wait_ready()

        from mule.flows.prefect_server import local_flow_settings

        with local_flow_settings():
            results = rebuild_flow(workdir=str(workdir.root), stages=stages, force=args.force or None, config=cfg,
                                   plan=planned)  # fmt: skip
        if server:
            server.stop()  # before the lock goes: the next run starts a server on the same database
    print_results(results, workdir, started, args)
    return 0


def photos_for_preset(workdir: Workdir, overrides: dict) -> int | None:
    """The photos a run without --preset is sized by: those of the folder it names
    (--images, else <source>/images), else those its workdir's last ingest of the dataset
    found (so `mule run train` after `mule run all --images ...` keeps that run's preset);
    None for a generated dataset (its preset is its own) or one not ingested here."""
    from mule.config.resolution import photos_given
    from mule.config.sections import DataConfig
    from mule.data_catalog.sources import GENERATED

    dataset = str(overrides.get("data.dataset", DataConfig.dataset))
    if dataset in GENERATED:
        return None
    if overrides.get("data.images") or overrides.get("data.source"):
        return photos_given(overrides)
    try:
        record = json.loads(workdir.stage_record_path(dataset, "ingest").read_text(encoding="utf-8"))
        return int(record["result"]["images_present"]) or None
    except (OSError, ValueError, KeyError, TypeError):  # not ingested here yet, or a record from before
        return None


def _prefect_ready(workdir: Workdir) -> None:
    from mule.mule_core.devices import idle_threads_sleep

    idle_threads_sleep()  # stages will run: before anything imports torch, on a busy machine threads sleep, not spin
    from mule.experiments.mlflow_store import seed_store
    from mule.flows.environment import check_prefect_database, prepare_environment, seed_prefect_home

    prepare_environment(workdir.root)
    check_prefect_database()
    seed_prefect_home()  # a new workdir's databases from templates, not migrated from nothing
    seed_store(workdir)


def _waiting_for(workdir: Workdir):
    from mule.storage.locks import describe

    def waiting(holder: dict) -> None:
        print(f"waiting for the workdir {workdir.root}: in use by {describe(holder)} (Ctrl-C stops waiting)",
              file=sys.stderr, flush=True)  # fmt: skip

    return waiting


def _stopped_line(workdir: Workdir, cfg, began: float):
    """The one line printed when a signal stops the run: where it stopped, what it kept."""

    def line(signum: int) -> str:
        from mule.storage.locks import last_stage

        how = interrupts.how

        stage = last_stage() or "starting"
        finished, unpublished = [], []
        for path in sorted(workdir.root.glob(f"state/stages/{cfg.data.dataset}/*.json")):
            try:
                record = json.loads(path.read_text())
                if record.get("finished", 0) >= began:
                    finished.append((record["finished"], path.stem))
                    if record.get("published") is False:
                        unpublished.append(path.stem)
            except (OSError, ValueError, KeyError, TypeError):
                continue
        done = [name for _, name in sorted(finished) if name not in unpublished]
        kept = [", ".join(done) + " (finished)"] if done else []
        if unpublished:
            kept.append(
                f"{', '.join(unpublished)}: computed and recorded, not yet published (the next run publishes it)"
            )
        resumes = BY_NAME[stage].resumes if stage in BY_NAME else ""
        if resumes and stage not in unpublished:
            kept.append(f"{stage}: {resumes}")
        where = ("before any stage started" if stage in ("starting", "rebuild") or stage.startswith("run: ")
                 else f"in stage {stage}")  # fmt: skip
        return (f"mule: stopped by {how(signum)} {where}; kept: {'; '.join(kept) or 'what earlier runs made'}; "
                "run the same command to resume")  # fmt: skip

    return line


def print_results(results: dict, workdir: Workdir, started: float, args: argparse.Namespace | None = None) -> None:
    decided = results.get("stages") or {}
    if any(d.startswith("ran") for d in decided.values()):  # each stage's line, with why, is above
        ran = [s for s, d in decided.items() if d.startswith("ran")]
        reused = [s for s in decided if s not in ran]
        print(f"\nStages: ran {', '.join(ran)}" + (f"; reused {', '.join(reused)}" if reused else ""))
        for stage in reused:  # what the console's line could not say yet (published now, for a stopped run)
            if not re.fullmatch(r"reused \(key \w+\)", decided[stage]):
                print(f"  {stage:<10} {decided[stage]}")
    elif decided:
        print("\nStages:")
        for stage, decision in decided.items():
            print(f"  {stage:<{max(10, *map(len, decided))}} {decision}")
    evaluation = results.get("evaluate")
    if evaluation and not evaluation["table"]:
        from mule.experiments.report import cross_lingual_markdown

        print(f"\nNo images: cross-lingual sentence retrieval at the MULE layer ({evaluation['split']}):\n")
        print(cross_lingual_markdown(evaluation["cross_lingual"], pairs=evaluation.get("translation_pairs"),
                                     ceilings=evaluation.get("translation_ceiling")))  # fmt: skip
        print(f"figures and tables: {evaluation['results_dir']}")
    elif evaluation:
        from mule.experiments.report import recall_markdown

        print(f"\nTest recalls per language ({evaluation['split']}):\n")
        print(recall_markdown(evaluation["table"], evaluation.get("chance")))
        chance = evaluation.get("chance_mean_mR")
        beside = f", chance {chance:.1f}" if chance is not None else ""
        print(f"\nmean mR over languages: {evaluation['mean_mR']:.1f}   (best epoch {evaluation['best_epoch']}{beside})")
        if evaluation.get("ceiling"):
            ceiling = evaluation["ceiling"]
            per_language = ", ".join(f"{lang} {row['mR']:.1f}" for lang, row in ceiling.items())
            mean = sum(row["mR"] for row in ceiling.values()) / len(ceiling)
            print(
                f"the data's ceiling (Bayes-optimal: knows every scene and the generator): mean mR {mean:.1f} ({per_language})"
            )
        print(f"figures and tables: {evaluation['results_dir']}")
    if results.get("ablation"):
        print("\nAblation: mR per language (test)\n")
        print(results["ablation"]["markdown"])
        print(f"table, CSV and chart: {results['ablation']['results_dir']}")
    if results.get("add-language"):
        print("\nAdding a language: test mR per language\n")
        print(results["add-language"]["markdown"])
        print(f"report: {results['add-language']['report']}")
    if results.get("mlflow_run_id"):
        print(f"MLflow run {results['mlflow_run_id']}: browse with `mule ui --workdir {workdir.root}`")
    else:
        print(f"MLflow: recorded by the next run, or as `mule ui --workdir {workdir.root}` opens (nothing writes "
              "the workdir once this returns)")  # fmt: skip
    log = getattr(args, "run_log", None) if args is not None else None
    print(f"wall time: {time.perf_counter() - started:.0f}s" + (f"; the run's whole log: {log}" if log else ""))
