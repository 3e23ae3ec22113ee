"""The `mule` command.

    mule demo [--dataset coco] [--train-images N ...]    the whole pipeline on a generated dataset
    mule run STAGE... [--dataset NAME --source PATH]     some stages (or `all`)
    mule ui [--workdir DIR] [--open]                     MLflow UI on the workdir's store, at the runs
    mule serve [--version N] [--port 8000]               a search page and JSON API (the champion)
    mule config [--preset P] [--set K=V ...]             the resolved config
    mule catalog [--workdir DIR]                         what the catalog holds
    mule search "TEXT" [--lang de] [--k 5] [--out PNG]   images for a sentence (the registry's champion)
    mule search --image PATH                             sentences for an image, per language

The workdir is --workdir, else $MULE_HOME, else ./mule-work.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from mule.data_catalog.workdir import Workdir
from mule.mule_core.config import PRESETS, ConfigError, parse_assignments, resolve, to_dict
from mule.mule_core.errors import is_user_error
from mule.pipeline.declaration import ALL, REBUILD, in_pipeline_order

DEMO_DATASETS = {"multi30k": "embedded", "coco": "embedded-coco"}  # mule demo --dataset -> generated dataset
# What `mule serve` reads of the config: given to it, never taken from the trained model's
# stored config (a model trained before a change would keep the old value for ever).
SERVING_OPTIONS = ("index.breadth", "index.min_images")


def serving_options(assignments: list[str]):
    """The index section for `mule serve`: the defaults, and the --set serving options."""
    overrides = parse_assignments(assignments)
    other = [k for k in overrides if k not in SERVING_OPTIONS]
    if other:
        raise ConfigError(f"mule serve: {', '.join(other)} is not a serving option; serving options are "
                          f"{', '.join(SERVING_OPTIONS)} (the model's own settings come with the model)")  # fmt: skip
    return resolve("demo", overrides).index


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--workdir", help="where everything is written (default: $MULE_HOME or ./mule-work)")
    parser.add_argument("--preset", default="demo", choices=sorted(PRESETS), help="named config (default: demo)")
    parser.add_argument("--set", dest="assignments", action="append", default=[], metavar="KEY=VALUE",
                        help="override a config option, e.g. --set train.epochs=5 (repeatable)")  # fmt: skip


def _force(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--force", action="append", default=[], metavar="STAGE",
                        help="run this stage even if its inputs, config and code are unchanged (repeatable)")  # fmt: skip


def _wait(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--wait", action="store_true",
                        help="if another mule process is using the workdir, wait for it to finish, then run "
                        "(default: refuse at once)")  # fmt: skip


def _data_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--dataset", help="dataset name in the catalog (default: embedded)")
    parser.add_argument("--source", help="folder with the raw dataset files (official Multi30K layout)")
    parser.add_argument("--images", help="folder with the image files (default: <source>/images)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="mule", description="Multilingual image-sentence retrieval (MULE).")
    sub = parser.add_subparsers(dest="command", required=True)

    demo = sub.add_parser("demo", help="generate the embedded dataset and run the whole pipeline on it")
    _common(demo)
    demo.add_argument("--dataset", choices=sorted(DEMO_DATASETS), default="multi30k",
                      help="multi30k: the Multi30K-style embedded dataset (en, de, fr, cs); coco: the COCO-style one "
                      "(en, ja, zh, unbalanced)")  # fmt: skip
    for name in ("train-images", "val-images", "test-images"):
        demo.add_argument(
            f"--{name}", type=int, help="embedded dataset size (default: 3000, 500, 1000; coco: 4500, 200, 300)"
        )
    demo.add_argument("--seed", type=int, default=0, help="embedded dataset seed (default: 0)")
    _force(demo)
    _wait(demo)

    run = sub.add_parser("run", help="run some stages: " + ", ".join(ALL) + " (or all)")
    run.add_argument("stages", nargs="+", metavar="STAGE")
    run.add_argument("--lang", help="add-language: the language to add (train.add_language)")
    _common(run)
    _force(run)
    _wait(run)
    _data_options(run)

    ui = sub.add_parser("ui", help="start the MLflow UI on the workdir's tracking store")
    ui.add_argument("--workdir")
    ui.add_argument("--host", default="127.0.0.1")
    ui.add_argument("--port", type=int, default=5000)
    # One person browsing their own runs: one server process answers its first request after
    # 17 s on 2 cores, MLflow's default four (each importing MLflow) after 36 s
    ui.add_argument("--workers", type=int, default=1, help="server processes (MLflow's default: 4)")
    ui.add_argument("--dataset", help="the dataset whose runs to land on (default: the one that ran last)")
    ui.add_argument("--open", action="store_true", help="open the runs in a web browser once the UI answers")

    serve = sub.add_parser("serve", help="a search page and JSON API on a trained model (the registry's champion)")
    serve.add_argument("--workdir")
    serve.add_argument("--dataset", default="embedded", help="the dataset whose model and catalog to serve")
    serve.add_argument("--version", help="a registered version to serve instead of the champion")
    serve.add_argument("--run", help="a train run id to serve instead of the registry's champion")
    serve.add_argument("--split", default="all", help="the gallery: this split (name or role) only (default: all)")
    serve.add_argument(
        "--host", default="127.0.0.1", help="address to listen on (default: 127.0.0.1, this machine only)"
    )
    serve.add_argument("--port", type=int, default=8000)
    serve.add_argument("--max-upload-mb", type=float, default=10.0, help="largest image upload (default: 10)")
    serve.add_argument("--max-megapixels", type=float, default=40.0,
                       help="largest image upload in pixels, read from its header before decoding (default: 40)")
    serve.add_argument("--max-in-flight", type=int, default=64,
                       help="requests admitted at once, uploads apart; the next get 503 with Retry-After (default: 64)")
    serve.add_argument("--max-uploads", type=int, default=8,
                       help="image uploads admitted at once, apart from the other requests (default: 8)")
    serve.add_argument("--header-timeout", type=float, default=10.0,
                       help="seconds a request's headers may take to arrive; then 408 (default: 10)")
    serve.add_argument("--body-timeout", type=float, default=10.0,
                       help="seconds an upload's body may take to arrive; then 408 (default: 10)")
    serve.add_argument("--reload", type=float, default=30.0,
                       help="every this many seconds, serve a new champion or new gallery images if a run made "
                            "them (0: never; default: 30)")
    serve.add_argument("--threads", type=int, default=0,
                       help="threads for the encoders and the gallery scan (default: one per core)")
    serve.add_argument("--allowed-host", action="append", default=[],
                       help="another name the Host header may carry (a proxy's, a DNS name); repeatable")
    serve.add_argument("--index", choices=["auto", "on", "off"], default="auto",
                       help="search images through the index stage's approximate index: auto from "
                            "index.min_images images (default), on whenever it matches the model, off never")  # fmt: skip
    serve.add_argument("--set", dest="assignments", action="append", default=[], metavar="KEY=VALUE",
                       help="a serving option: " + ", ".join(SERVING_OPTIONS) + " (e.g. --set index.breadth=256)")

    config = sub.add_parser("config", help="print the resolved config")
    _common(config)
    _data_options(config)

    search = sub.add_parser("search", help="query a trained model: sentence -> images, or --image PATH -> sentences")
    search.add_argument("text", nargs="?", help="the sentence to search images for")
    search.add_argument("--image", help="an image file: search sentences for it, in every language")
    search.add_argument("--lang", help="the sentence's language (default: detected from the model's vocabularies)")
    search.add_argument("--k", type=int, default=5, help="results to show (per language for --image; default: 5)")
    search.add_argument("--dataset", default="embedded", help="the dataset whose model and catalog to use")
    search.add_argument("--run", help="a train run id to use instead of the registry's champion")
    search.add_argument("--version", help="a registered version to use instead of the champion")
    search.add_argument("--split", default="all", help="search this split (name or role) only (default: all)")
    search.add_argument("--out", help="also write a contact sheet of the results (PNG)")
    search.add_argument("--workdir")

    catalog = sub.add_parser("catalog", help="list the catalog's datasets and tables")
    catalog.add_argument("--workdir")
    return parser


def overrides_from(args: argparse.Namespace) -> dict[str, str]:
    overrides = parse_assignments(args.assignments)
    for option, key in (("dataset", "data.dataset"), ("source", "data.source"), ("images", "data.images"),
                        ("lang", "train.add_language")):  # fmt: skip
        value = getattr(args, option, None)
        if value:
            overrides[key] = value
    return overrides


def _prefect_ready(workdir: Workdir) -> None:
    from .runtime import check_prefect_database, prepare_environment

    prepare_environment(workdir.root)
    check_prefect_database()


def _print_results(results: dict, workdir: Workdir, started: float) -> None:
    if results.get("stages"):
        print("\nStages:")
        for stage, decision in results["stages"].items():
            print(f"  {stage:<{max(10, *map(len, results['stages']))}} {decision}")
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
        print(recall_markdown(evaluation["table"]))
        print(f"\nmean mR over languages: {evaluation['mean_mR']:.1f}   (best epoch {evaluation['best_epoch']})")
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
        print(f"MLflow: recorded in a few seconds, by a process of its own; browse with `mule ui --workdir {workdir.root}`")
    print(f"wall time: {time.perf_counter() - started:.0f}s")


def cmd_run(args: argparse.Namespace, stages: list[str], overrides: dict) -> int:
    unknown = [s for s in args.force if s not in REBUILD]
    if unknown:
        raise ConfigError(f"--force {', '.join(unknown)}: not a stage; stages are: {', '.join(REBUILD)}")
    workdir = Workdir.at(args.workdir)
    cfg = resolve(args.preset, overrides)  # config errors before Prefect starts
    if "ingest" in stages:
        from mule.data_catalog.sources import locate

        locate(workdir, cfg.data)  # a missing --source fails here, in milliseconds
    started = time.perf_counter()
    from mule.data_catalog.locks import workdir_lock

    from . import interrupts

    interrupts.install(_stopped_line(workdir, cfg, time.time()))
    # The lock before anything touches the workdir, Prefect's database included: a second
    # run is refused (or waits) before it starts a server of its own.
    with workdir_lock(workdir, "starting", wait=args.wait, waiting=_waiting_for(workdir)):
        results = _without_prefect_if_up_to_date(workdir, cfg, stages, args.force)
        if results is not None:
            print("every stage is up to date: nothing ran, and Prefect was not started (MLflow records the "
                  "reuse; --force STAGE runs one anyway)")  # fmt: skip
            _print_results(results, workdir, started)
            return 0
        _prefect_ready(workdir)
        from .runtime import start_prefect_early

        server = start_prefect_early()  # boots while the stages' modules import
        from .stages import rebuild_flow

        if server:
            server.wait_ready()

        from .runtime import local_flow_settings

        with local_flow_settings():
            results = rebuild_flow(workdir=str(workdir.root), preset=args.preset, overrides=overrides,
                                   stages=stages, force=args.force or None, config=to_dict(cfg))  # fmt: skip
        if server:
            server.stop()  # before the lock goes: the next run starts a server on the same database
    _print_results(results, workdir, started)
    return 0


def _waiting_for(workdir: Workdir):
    from mule.data_catalog.locks import describe

    def waiting(holder: dict) -> None:
        print(f"waiting for the workdir {workdir.root}: in use by {describe(holder)} (Ctrl-C stops waiting)",
              file=sys.stderr, flush=True)  # fmt: skip

    return waiting


# What a stage keeps of its own work when it is stopped (else: what it finished)
RESUMES = {"features": "the images extracted so far", "train": "its checkpoint of the last finished epoch",
           "pretrain": "its checkpoint of the last finished epoch",
           "translate": "the sentences translated so far", "ablation": "the variants finished",
           "add-language": "the steps finished"}  # fmt: skip


def _stopped_line(workdir: Workdir, cfg, began: float):
    """The one line printed when a signal stops the run: where it stopped, what it kept."""

    def line(signum: int) -> str:
        from mule.data_catalog.locks import last_stage

        from .interrupts import how

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
        kept = [", ".join(name for _, name in sorted(finished)) + " (finished)"] if finished else []
        if unpublished:
            kept.append(f"{', '.join(unpublished)}: computed and recorded, not yet published (the next run publishes it)")
        if stage in RESUMES and stage not in unpublished:
            kept.append(f"{stage}: {RESUMES[stage]}")
        where = "before any stage started" if stage in ("starting", "rebuild") or stage.startswith("run: ") else (
            f"in stage {stage}")  # fmt: skip
        return (f"mule: stopped by {how(signum)} {where}; kept: {'; '.join(kept) or 'what earlier runs made'}; "
                "run the same command to resume")  # fmt: skip

    return line


def _without_prefect_if_up_to_date(workdir: Workdir, cfg, stages: list[str], force: list[str]) -> dict | None:
    """When no stage has to run: the results, without starting Prefect, and without
    importing MLflow or torch: the rebuild's record (MLflow runs saying each stage was
    reused, and why) is written right after by a process of its own (pipeline.deferred),
    unless a stage has something to publish. None when a stage has to run (then the
    rebuild flow decides again, stage by stage)."""
    if force or os.environ.get("MULE_UP_TO_DATE_CHECK") == "0":
        return None
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    os.environ.setdefault("GIT_PYTHON_REFRESH", "quiet")
    from mule.data_catalog.locks import workdir_lock
    from mule.experiments import relocation
    from mule.pipeline import deferred, rebuild, reuse
    from mule.pipeline.declaration import BY_NAME

    stages = in_pipeline_order(stages)  # as the rebuild flow runs them
    name = rebuild.run_name(stages)
    with workdir_lock(workdir, name):
        relocation.adopt(workdir)
        stages = rebuild.plan(workdir, cfg, stages)  # as the rebuild flow plans them
        decided = rebuild.up_to_date(workdir, cfg, stages, set())
        if decided is None:
            return None
        later = not any(reuse.publish_pending(d) for d in decided.values()) and all(
            BY_NAME[s].kind != "sweep" for s in stages)  # fmt: skip
        if later and os.environ.get("MULE_RECORD_LATER") != "0":
            results = {stage: reuse.reused_result(d, workdir) for stage, d in decided.items()}
            decisions = {stage: d.describe() for stage, d in decided.items()}
            deferred.defer(workdir, cfg, name, decided, results)
            deferred.start_recorder(workdir)
            return results | {"mlflow_run_id": None, "stages": decisions}
        from mule.experiments import tracking

        deferred.record_unrecorded(workdir)
        with tracking.run(workdir, cfg, name) as run_id:
            results, decisions = rebuild.run_stages(workdir, cfg, stages, set(), run_id, None, reuse.reuse_stage,
                                                    decided)  # fmt: skip
            rebuild.report(workdir, cfg, results, decisions, run_id)
    return results | {"mlflow_run_id": run_id, "stages": decisions}


def _reading(path: str | None, command: str) -> Workdir:
    """The workdir for a reading command (serve, search, catalog, ui): it takes no lock and
    writes nothing there, while a run may be writing it. A workdir copied or moved since its
    last run is read where it is now; the next run points its stored paths here for good."""
    from mule.experiments import tracking

    workdir = Workdir.at(path)
    if not workdir.root.is_dir():
        raise ConfigError(f"mule {command}: there is no workdir at {workdir.root}: run `mule demo` (or `mule run`) first")
    tracking.check_store(workdir)
    moved = workdir.moved_from()
    if moved is not None:
        print(f"mule {command}: {workdir.root} was copied or moved from {moved}; read where it is now (the next "
              "`mule run` points its stored paths here)", flush=True)  # fmt: skip
    return workdir


def cmd_ui(args: argparse.Namespace) -> int:
    """MLflow's UI on the workdir's store; prints (and with --open, opens) the address of the
    dataset's runs: the experiment's runs table in the model-training view, which MLflow 3
    takes from the address (workflowType), not from the experiment's tag."""
    if args.workers < 1:
        raise ConfigError(f"--workers must be at least 1, got {args.workers}")
    from mule.experiments import tracking

    workdir = _reading(args.workdir, "ui")
    if not tracking.store_exists(workdir):
        print(f"no runs yet in {workdir.root}: run `mule demo` first", flush=True)
        return 1
    base = f"http://{_browsable(args.host)}:{args.port}"
    runs = tracking.runs_address(workdir, base, args.dataset)
    command = [sys.executable, "-m", "mlflow", "ui", "--backend-store-uri", workdir.mlflow_uri,
               "--default-artifact-root", workdir.artifacts_dir.as_uri(), "--host", args.host, "--port", str(args.port),
               "--workers", str(args.workers)]  # fmt: skip
    print(f"MLflow UI for {workdir.root} at {base}", flush=True)
    print(f"runs: {runs}" if runs else "no runs yet: run `mule demo` first", flush=True)
    import signal
    import subprocess
    import webbrowser

    from . import interrupts

    # Its own session, so that this process alone decides when it stops (MLflow's server
    # starts workers of its own): Ctrl-C and SIGTERM stop the whole group, and free the port.
    server = subprocess.Popen(command, start_new_session=True)
    interrupts.on_stop(lambda: _stop_group(server), abandon=lambda: _kill_group(server, signal.SIGKILL))
    interrupts.install(lambda signum: f"mule ui: stopped by {interrupts.how(signum)}; port {args.port} is free")
    if args.open and _answers(f"{base}/health", server):
        webbrowser.open(runs or base)
    return server.wait()


def _kill_group(process, signum) -> None:
    import contextlib

    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signum)


def _stop_group(process, grace: float = 1.0) -> None:
    """SIGTERM to a server's process group, SIGKILL if it is still there after `grace` seconds."""
    import signal
    import subprocess

    _kill_group(process, signal.SIGTERM)
    try:
        process.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        _kill_group(process, signal.SIGKILL)
        process.wait()


def _browsable(host: str) -> str:
    return "127.0.0.1" if host in ("0.0.0.0", "::", "") else host


def _answers(url: str, process, timeout: float = 120) -> bool:
    import urllib.request

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and process.poll() is None:
        try:
            with urllib.request.urlopen(url, timeout=2):
                return True
        except OSError:
            time.sleep(0.3)
    return False


def cmd_serve(args: argparse.Namespace) -> int:
    if not 1 <= args.port <= 65535:
        raise ConfigError(f"--port must be between 1 and 65535, got {args.port}")
    if args.max_upload_mb <= 0:
        raise ConfigError(f"--max-upload-mb must be positive, got {args.max_upload_mb}")
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")

    if args.max_megapixels <= 0 or args.max_in_flight < 1 or args.threads < 0:
        raise ConfigError("--max-megapixels and --max-in-flight must be positive, --threads at least 0")
    options = serving_options(args.assignments)
    if args.reload < 0 or args.header_timeout <= 0 or args.body_timeout <= 0 or args.max_uploads < 1:
        raise ConfigError("--reload must be at least 0, --header-timeout and --body-timeout positive, "
                          "--max-uploads at least 1")  # fmt: skip
    from mule.serving import live as serving

    started = time.perf_counter()
    workdir = _reading(args.workdir, "serve")
    request = serving.Request(workdir, args.dataset, args.run, args.version, args.split, args.index, options.breadth,
                              options.min_images)  # fmt: skip
    served, source, how = serving.load(request)
    embedder, gallery = served.embedder, served.gallery
    weights = embedder.warm_up()  # before the first queries, not during them
    captions = sum(len(c.ids) for c in gallery.captions.values())
    print(f"{embedder.label}: {len(gallery.image_ids):,} images and {captions:,} sentences "
          f"({', '.join(gallery.captions)}) of {args.dataset} ({args.split}) embedded in "
          f"{time.perf_counter() - started:.1f} s, {gallery.nbytes / 2**20:.1f} MiB; images searched by "
          f"{how}; image extractor {embedder.extractor} ({weights})", flush=True)  # fmt: skip
    import uvicorn

    from mule.serving.app import Live, allowed_hosts_for, create_app, deadline_protocol

    live = Live(served)
    app = create_app(embedder, gallery, int(args.max_upload_mb * 2**20), args.dataset,
                     max_pixels=int(args.max_megapixels * 1e6), max_in_flight=args.max_in_flight,
                     max_uploads=args.max_uploads, body_timeout=args.body_timeout, cpu_threads=args.threads or None,
                     allowed_hosts=allowed_hosts_for(args.host, tuple(args.allowed_host)), live=live)  # fmt: skip
    if args.reload:  # a new champion or new gallery images, served without a restart
        serving.Reloader(request, live, source, args.reload).start()
    print(f"search page: http://{_browsable(args.host)}:{args.port}/  (JSON API: /api/search?q=..., "
          f"POST /api/image; Ctrl-C stops)", flush=True)  # fmt: skip
    from . import interrupts

    interrupts.install(lambda signum: f"mule serve: stopped by {interrupts.how(signum)}; port {args.port} is free")
    # uvicorn takes Ctrl-C and SIGTERM while it serves and stops (answers in flight get a
    # second); it swallows the KeyboardInterrupt it raises again, so ask what stopped it.
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning", timeout_graceful_shutdown=1,
                http=deadline_protocol(args.header_timeout))  # fmt: skip
    stopped_by = interrupts.stopping()
    return interrupts.finish(stopped_by) if stopped_by else 0


def cmd_search(args: argparse.Namespace) -> int:
    if bool(args.text) == bool(args.image):
        raise ConfigError('search needs a sentence or --image PATH (one of them): mule search "a red circle" or '
                          "mule search --image photo.jpg")  # fmt: skip
    if args.k < 1:
        raise ConfigError(f"--k must be at least 1, got {args.k}")
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    from mule.data_catalog.locks import catalog_reading
    from mule.serving import search

    workdir = _reading(args.workdir, "search")
    with catalog_reading(workdir):  # never a stage's outputs half-written
        searcher = search.open_searcher(workdir, args.dataset, args.run, args.version)
        if args.text:
            found = search.search_text(searcher, args.text, args.lang, args.k, args.split)
        else:
            found = search.search_image(searcher, Path(args.image), args.k, args.split)
    if args.text:
        print(f"{found['model']}; query in {found['lang']} ({found['language']}); "
              f"{found['gallery']} images ({found['split']})")  # fmt: skip
        composed = set(found["composed_words"])
        unknown = [w for w in found["unknown_words"] if w not in composed]
        if composed:
            print(f"words outside the {found['lang']} vocabulary, built from their character n-grams: "
                  f"{', '.join(found['composed_words'])}")  # fmt: skip
        if unknown:
            print(f"words the {found['lang']} vocabulary does not know (read as <unk>): {', '.join(unknown)}")
        for r in found["results"]:
            print(f"{r['rank']:>3}  {r['score']:.3f}  {r['image_id']:<24} {r['split']:<10} {r['path']}")
    else:
        print(f"{found['model']}; image features: {found['features']}")
        for lang, results in found["results"].items():
            print(f"[{lang}]")
            for r in results:
                print(f"{r['rank']:>3}  {r['score']:.3f}  {r['text']}   ({r['image_id']})")
    if args.out:
        from mule.experiments import plots

        figure = plots.search_sheet(found)
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        figure.savefig(args.out, dpi=110)
        plots.close(figure)
        print(f"contact sheet: {args.out}")
    return 0


def cmd_catalog(args: argparse.Namespace) -> int:
    from mule.data_catalog import queries
    from mule.data_catalog.catalog import Catalog
    from mule.data_catalog.locks import catalog_reading

    workdir = _reading(args.workdir, "catalog")
    catalog = Catalog(workdir, read_only=True)
    if not catalog.datasets():
        print(f"the catalog in {workdir.root} is empty: run `mule demo` or `mule run ingest ...`")
        return 0
    print(f"catalog: {workdir.duckdb_path}")
    with catalog_reading(workdir):
        held = queries.summary(catalog)
        identities = {dataset: catalog.feature_identities(dataset) for dataset in catalog.datasets()}
    for row in held["images"]:
        print(
            f"  images    {row['dataset']:<12} {row['split']:<18} {row['images']:>7}  ({row['with_file']} with a file)"
        )
    for row in held["captions"]:
        print(f"  captions  {row['dataset']:<12} {row['split']:<18} {row['lang']:<4} {row['n']:>7}  {row['origin']}")
    for row in held["rejects"]:
        print(f"  rejects   {row['dataset']:<12} {row['kind']:<18} {row['n']:>7}")
    for dataset, rows in identities.items():
        for row in rows:
            use = "current" if row["current"] else "kept (a model may use it; delete the folder to free it)"
            print(f"  features  {dataset:<12} {row['extractor']:<50} {row['rows']:>7}  "
                  f"{row['bytes'] / 2**20:.1f} MiB, {use}")  # fmt: skip
    return 0


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if os.environ.get("MULE_CRASH_AT") or os.environ.get("MULE_BUG_AT"):  # tests that kill runs ask for it
        from mule.data_catalog import faults

        faults.install()
    try:
        if args.command == "demo":
            overrides = parse_assignments(args.assignments)
            overrides.update({"data.dataset": DEMO_DATASETS[args.dataset], "data.seed": args.seed})
            for option in ("train_images", "val_images", "test_images"):
                if getattr(args, option) is not None:
                    overrides[f"data.{option}"] = getattr(args, option)
            return cmd_run(args, list(REBUILD), overrides)
        if args.command == "run":
            stages = list(REBUILD) if args.stages == ["all"] else args.stages
            unknown = [s for s in stages if s not in ALL]
            if unknown:
                names = ", ".join(ALL)
                raise ConfigError(f"unknown stage(s) {', '.join(unknown)}; stages are: {names}, all")
            return cmd_run(args, stages, overrides_from(args))
        if args.command == "ui":
            return cmd_ui(args)
        if args.command == "config":
            print(json.dumps(to_dict(resolve(args.preset, overrides_from(args))), indent=2))
            return 0
        if args.command == "catalog":
            return cmd_catalog(args)
        if args.command == "search":
            return cmd_search(args)
        if args.command == "serve":
            return cmd_serve(args)
    except KeyboardInterrupt as stop:
        from .interrupts import Interrupted, finish

        if isinstance(stop, Interrupted):
            return finish(stop.signum)  # the cleanups, the one line
        print("mule: interrupted; run the same command to resume", file=sys.stderr)
        return 130
    except Exception as error:  # noqa: BLE001 - one clear line for the errors users can fix
        from .interrupts import finish, stopping

        if (signum := stopping()) is not None:  # an error the stop caused while unwinding: the stop is the news
            return finish(signum)
        if is_user_error(error):
            print(f"mule: error: {error}", file=sys.stderr)
            return 2
        raise  # a bug: its traceback is what we need
    return 0


def _end_open_mlflow_runs() -> None:
    """MLflow runs still open when a signal ends the process before they could unwind: KILLED."""
    tracking = sys.modules.get("mule.experiments.tracking")
    if tracking is not None:
        tracking.end_open_runs("KILLED")


def entry() -> None:
    """The console script. After the command, the exit handlers run (Prefect drains its
    logs and events, the temporary server stops); then the process ends without the
    interpreter's teardown of torch and the rest, which takes seconds and writes nothing."""
    from . import interrupts

    interrupts.install(lambda signum: f"mule: stopped by {interrupts.how(signum)}")
    interrupts.on_stop(_end_open_mlflow_runs)
    code = main()
    import atexit

    sys.stdout.flush()
    sys.stderr.flush()
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":  # pragma: no cover
    entry()
