"""The `mule` command's arguments: one function a subcommand, each adding its parser to
`sub`; build_parser() assembles them. What each command does is in its own module
(commands/run.py, serve.py, ...); commands/main.py dispatches."""

from __future__ import annotations

import argparse

from mule.commands.serve import SERVING_OPTIONS
from mule.config.presets import PRESETS
from mule.pipeline.declaration import ALL, REBUILD

DEMO_DATASETS = {"multi30k": "embedded", "coco": "embedded-coco", "table": "embedded-table"}  # mule demo --dataset -> generated dataset


VERBOSE = "show everything on the console: Prefect's and MLflow's lines, every epoch (the run's log in <workdir>/logs has them)"


def _verbose(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-v", "--verbose", action="store_true", default=argparse.SUPPRESS, help=VERBOSE)


def _common(parser: argparse.ArgumentParser) -> None:
    _verbose(parser)
    parser.add_argument("--workdir", help="where everything is written (default: $MULE_HOME or ./mule-work)")
    parser.add_argument("--preset", choices=sorted(PRESETS),
                        help="named config (default: demo on the generated Multi30K-style dataset, else default)")  # fmt: skip
    parser.add_argument("--set", dest="assignments", action="append", default=[], metavar="KEY=VALUE",
                        help="override a config option, e.g. --set train.epochs=5 (repeatable)")  # fmt: skip


def _force(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--force", action="append", default=[], metavar="STAGE",
                        help="run this stage even if its inputs, config and code are unchanged (repeatable)")  # fmt: skip


class _Removed(argparse.Action):
    """A flag that no longer exists, refused in one line saying why (argparse would only say
    "unrecognized arguments")."""

    def __call__(self, parser, namespace, values, option_string=None):
        parser.error(f"{option_string} was removed on 2026-12-06: stages run one at a time always; drop the flag")


def _sequential(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--sequential", nargs=0, action=_Removed, help=argparse.SUPPRESS)


def _wait(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--wait", action="store_true",
                        help="if another mule process is using the workdir, wait for it to finish, then run "
                        "(default: refuse at once)")  # fmt: skip


def _data_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--dataset", help="the dataset's name in the catalog, any name for your own data (default: "
                        "embedded, the generated one; multi30k and coco imply their readers and languages)")  # fmt: skip
    parser.add_argument("--source", help="the folder that holds the dataset's files, in any layout mule reads: a "
                        "captions table (captions.csv or metadata.jsonl: image, text, lang) beside the photos, "
                        "Multi30K's data/ tree, or MSCOCO's caption files; the layout is found from the files")  # fmt: skip
    parser.add_argument("--images", help="folder with the image files (default: <source>/images, or the table's paths)")


def _stages_description() -> str:
    from mule.pipeline.declaration import BY_NAME

    width = max(map(len, ALL))
    lines = ["Runs the named stages (and, of what they read, what is missing or out of date); `all`: the rebuild "
             "(" + ", ".join(REBUILD) + "). A stage whose inputs, options and code are unchanged is reused.", "",
             "stages:"]  # fmt: skip
    lines += [f"  {name:<{width}}  {BY_NAME[name].summary}" for name in ALL]
    lines += ["", "Your own data: a folder with your photos and a captions.csv (image,text,lang):",
              "  mule run all --dataset shop --source FOLDER"]  # fmt: skip
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="mule", description="Multilingual image-sentence retrieval (MULE).")
    parser.add_argument("-v", "--verbose", action="store_true", help=VERBOSE)
    sub = parser.add_subparsers(dest="command", required=True)

    _demo_command(sub)
    _run_command(sub)
    _ui_command(sub)
    _serve_command(sub)
    _config_command(sub)
    _search_command(sub)
    _export_command(sub)
    _embed_command(sub)
    _catalog_command(sub)
    return parser


def _demo_command(sub) -> None:
    """`mule demo`'s options."""
    demo = sub.add_parser("demo", help="generate the embedded dataset and run the whole pipeline on it")
    _common(demo)
    demo.add_argument("--dataset", choices=sorted(DEMO_DATASETS), default="multi30k",
                      help="multi30k: the Multi30K-style embedded dataset (en, de, fr, cs); coco: the COCO-style one "
                      "(en, ja, zh, unbalanced); table: the table layout (a photo folder and captions.csv, en and es)")  # fmt: skip
    for name in ("train-images", "val-images", "test-images"):
        demo.add_argument(
            f"--{name}", type=int, help="embedded dataset size (default: 3000, 500, 1000; coco: 4500, 200, 300)"
        )
    demo.add_argument("--seed", type=int, default=0, help="embedded dataset seed (default: 0)")
    _force(demo)
    _sequential(demo)
    _wait(demo)


def _run_command(sub) -> None:
    """`mule run`'s options."""
    run = sub.add_parser("run", help="run some stages: " + ", ".join(ALL) + " (or all)",
                         description=_stages_description(), formatter_class=argparse.RawDescriptionHelpFormatter)
    run.add_argument("stages", nargs="+", metavar="STAGE")
    run.add_argument("--lang", help="add-language: the language(s) to add, in order: es, or es,ja (add.languages)")
    run.add_argument("--captions", action="append", default=[], metavar="[LANG=]FILE",
                     help="add-language: a table of the added language's captions of the dataset's images (CSV, "
                          "TSV, JSON Lines or Parquet: image, caption[, lang][, split]); repeatable "
                          "(add.captions)")  # fmt: skip
    _common(run)
    _force(run)
    _sequential(run)
    _wait(run)
    _data_options(run)


def _ui_command(sub) -> None:
    """`mule ui`'s options."""
    ui = sub.add_parser("ui", help="start the MLflow UI on the workdir's tracking store")
    ui.add_argument("--workdir")
    ui.add_argument("--host", default="127.0.0.1")
    ui.add_argument("--port", type=int, default=5000)
    # One person browsing their own runs: one server process answers its first request after
    # 17 s on 2 cores, MLflow's default four (each importing MLflow) after 36 s
    ui.add_argument("--workers", type=int, default=1, help="server processes (MLflow's default: 4)")
    ui.add_argument("--dataset", help="the dataset whose runs to land on (default: the one that ran last)")
    ui.add_argument("--open", action="store_true", help="open the runs in a web browser once the UI answers")


def _serve_command(sub) -> None:
    """`mule serve`'s options."""
    serve = sub.add_parser("serve", help="a search page and JSON API on a trained model (the registry's champion)")
    _verbose(serve)
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
    serve.add_argument(
        "--max-megapixels",
        type=float,
        default=40.0,
        help="largest image upload in pixels, read from its header before decoding (default: 40)",
    )
    serve.add_argument(
        "--max-in-flight",
        type=int,
        default=64,
        help="requests admitted at once, uploads apart; the next get 503 with Retry-After (default: 64)",
    )
    serve.add_argument(
        "--max-uploads",
        type=int,
        default=8,
        help="image uploads admitted at once, apart from the other requests (default: 8)",
    )
    serve.add_argument(
        "--header-timeout",
        type=float,
        default=10.0,
        help="seconds a request's headers may take to arrive; then 408 (default: 10)",
    )
    serve.add_argument(
        "--body-timeout",
        type=float,
        default=10.0,
        help="seconds an upload's body may take to arrive; then 408 (default: 10)",
    )
    serve.add_argument(
        "--send-timeout",
        type=float,
        default=30.0,
        help="seconds a client may read nothing of an answer (a large image) before it is dropped (default: 30)",
    )
    serve.add_argument(
        "--reload",
        type=float,
        default=30.0,
        help="every this many seconds, serve a new champion or new gallery images if a run made "
        "them (0: never; default: 30)",
    )
    serve.add_argument(
        "--threads", type=int, default=0, help="threads for the encoders and the gallery scan (default: one per core)"
    )
    serve.add_argument(
        "--allowed-host",
        action="append",
        default=[],
        help="another name the Host header may carry (a proxy's, a DNS name); repeatable",
    )
    serve.add_argument("--index", choices=["auto", "on", "off"], default="auto",
                       help="search images through the index stage's approximate index: auto from "
                            "index.min_images images (default), on whenever it matches the model, off never")  # fmt: skip
    serve.add_argument(
        "--set",
        dest="assignments",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a serving option: " + ", ".join(SERVING_OPTIONS) + " (e.g. --set index.breadth=256)",
    )


def _config_command(sub) -> None:
    """`mule config`'s options."""
    config = sub.add_parser("config", help="print the resolved config (--list: the presets)")
    _common(config)
    _data_options(config)
    config.add_argument("--list", action="store_true", help="list the presets (config/presets/*.toml) and stop")


def _search_command(sub) -> None:
    """`mule search`'s options."""
    search = sub.add_parser("search", help="query a trained model: sentence -> images, or --image PATH -> sentences")
    _verbose(search)
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


def _export_command(sub) -> None:
    """`mule export`'s options."""
    export = sub.add_parser("export", help="write a trained model as a folder that loads anywhere, with its model card")
    _verbose(export)
    export.add_argument("--out", required=True, help="the folder to write: absent, empty, or an earlier export "
                        "(replaced); never the workdir, `.` or a folder holding other files")  # fmt: skip
    export.add_argument("--dataset", default="embedded", help="the dataset whose champion to export")
    export.add_argument("--run", help="a train run id to export instead of the registry's champion")
    export.add_argument("--version", help="a registered version to export instead of the champion")
    export.add_argument("--model-file", help="a model file (model.pt) to export, without a workdir")
    export.add_argument("--no-onnx", action="store_true",
                        help="leave out the ONNX towers (textual/, visual/): safetensors and vocabularies only")  # fmt: skip
    export.add_argument("--workdir")
    export.add_argument("--wait", action="store_true",
                        help="when another mule writes next to --out, wait for it (default: refused, naming it)")  # fmt: skip


def _embed_command(sub) -> None:
    """`mule embed`'s options."""
    embed = sub.add_parser("embed", help="a folder of images or a table of sentences to vectors (Parquet, LanceDB, Qdrant)")
    _verbose(embed)
    embed.add_argument("--images", help="a folder of image files (searched below it)")
    embed.add_argument("--sentences", help="a table of sentences: CSV, TSV, JSONL or Parquet with a text column")
    embed.add_argument("--lang", help="the sentences' language where a row names none (default: detected)")
    embed.add_argument("--out", required=True, help="the folder of vectors (a rerun adds what it lacks)")
    embed.add_argument("--model", help="a model file, an exported folder or an MLflow URI (default: the champion)")
    embed.add_argument("--dataset", default="embedded", help="whose champion, when --model names none")
    embed.add_argument("--store", choices=["parquet", "lancedb", "qdrant"], default="parquet",
                       help="where the vectors go: Parquet parts (default), a LanceDB database or a local Qdrant "
                            "(both embedded: no server) at --out")  # fmt: skip
    embed.add_argument("--table", help="LanceDB's table or Qdrant's collection (default: images or sentences)")
    embed.add_argument("--engine", choices=["torch", "onnxruntime"], default="torch",
                       help="onnxruntime: the ONNX towers of the exported folder --model names")  # fmt: skip
    embed.add_argument("--int8", action="store_true", help="with --engine onnxruntime: the towers' 8-bit variants")
    embed.add_argument("--max-pixels", type=int, help="the largest image opened, in pixels from its header (default: "
                       "ingest's, Pillow's limit of 89,478,485; at most twice that)")  # fmt: skip
    embed.add_argument("--workdir")
    embed.add_argument("--wait", action="store_true",
                       help="when another mule writes into --out, wait for it (default: refused, naming it)")  # fmt: skip


def _catalog_command(sub) -> None:
    """`mule catalog`'s options."""
    catalog = sub.add_parser("catalog", help="list the catalog's datasets and tables")
    catalog.add_argument("--workdir")
    catalog.add_argument("--rejects", metavar="DATASET", nargs="?", const="",
                         help="list the rejected rows (of DATASET, or of every dataset): file, line, kind and reason")
    catalog.add_argument("--limit", type=int, default=50, help="rejected rows to list (default: 50)")
