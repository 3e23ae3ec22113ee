"""`mule embed`: a folder of images or a table of sentences to vectors, in a store that
says which model made them: Parquet parts, a LanceDB table or a local Qdrant collection
(serving.batch_embed, serving.vector_stores)."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from mule.mule_core.settings import ConfigError


def run(args: argparse.Namespace) -> int:
    if bool(args.images) == bool(args.sentences):
        raise ConfigError("mule embed: give --images DIR or --sentences TABLE (one of them)")
    from mule.datasets.image_files import CEILING_PIXELS, MAX_PIXELS

    if args.max_pixels is None:
        args.max_pixels = MAX_PIXELS
    elif not 1 <= args.max_pixels <= CEILING_PIXELS:
        raise ConfigError(f"mule embed: --max-pixels must be between 1 and {CEILING_PIXELS:,} (twice Pillow's limit, "
                          f"past which Pillow refuses an image itself), got {args.max_pixels:,}")  # fmt: skip
    from mule import api
    from mule.serving import batch_embed

    if args.engine != "torch" and not args.model:
        raise ConfigError("mule embed: --engine onnxruntime runs an exported folder's ONNX towers: name it with --model")

    started = time.perf_counter()
    if args.model:
        embedder = api.load(args.model, engine=args.engine, int8=args.int8)
    else:
        from mule.commands.options import reading_workdir

        embedder = api.load(reading_workdir(args.workdir, "embed").root, dataset=args.dataset)
    out = Path(args.out).expanduser()
    if args.images:
        found = batch_embed.embed_images(embedder, Path(args.images).expanduser(), out, store=args.store,
                                         table=args.table, max_pixels=args.max_pixels, wait=args.wait)  # fmt: skip
    else:
        found = batch_embed.embed_sentences(embedder, Path(args.sentences).expanduser(), out, lang=args.lang,
                                            store=args.store, table=args.table, wait=args.wait)  # fmt: skip
    name = args.table or ("images" if args.images else "sentences")
    reasons = {"parquet": f"{out}/rejects-*.parquet", "lancedb": f"table {name}_rejects in {out}",
               "qdrant": f"collection {name}_rejects in {out}"}[args.store]  # fmt: skip
    repeated = f", {found['repeated']} repeated rows left out" if found.get("repeated") else ""
    print(f"{embedder.label}: {found['embedded']} embedded, {found['rejected']} rejected (their reasons: "
          f"{reasons}), {found['already']} already in {out}{repeated}; {time.perf_counter() - started:.1f} s")  # fmt: skip
    return 0
