"""The gallery index: every image with features from the model's extractor, pushed through
the trained model's image branch, in an approximate index (data_catalog.ann) kept in the
catalog (data_catalog.index_files). `mule serve` searches it once the gallery has
index.min_images images or more; below that it scans the vectors exactly."""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from mule.data_catalog import ann, index_files
from mule.data_catalog.model_files import load_model
from mule.mule_core.embedder import Embedder
from mule.mule_core.progress import SHOWN
from mule.storage.content_digests import sha256_file
from mule.tasks.shared.context import StageContext, logger


def compute(ctx: StageContext) -> dict[str, Any]:
    wd, catalog, cfg = ctx.workdir, ctx.catalog, ctx.cfg
    dataset, name = cfg.data.dataset, cfg.output.model_name
    path = wd.model_path(dataset, name)
    model, meta = load_model(path)
    if model.image_branch is None:
        logger().info("%s was trained without images: no gallery to index", path, extra=SHOWN)
        return {"images": 0, "kind": None}
    extractor = meta["extractor"]
    image_ids = sorted(catalog.extracted_image_ids(dataset, extractor))
    embedder = Embedder(model, meta, str(path))
    started = time.perf_counter()
    if image_ids:
        vectors = embedder.images_from_features(catalog.read_features(dataset, extractor, image_ids))
    else:
        vectors = np.zeros((0, cfg.model.joint_dim), np.float32)
    embedded = time.perf_counter() - started

    def progress(done: int, total: int) -> None:
        rate = done / max(1e-9, time.perf_counter() - started - embedded)
        logger().info("index: %s/%s vectors added (%.0f/s, ETA %.0f s)", f"{done:,}", f"{total:,}", rate,
                      (total - done) / max(rate, 1e-9), extra=SHOWN)  # fmt: skip

    index = ann.build(vectors, cfg.index.kind, cfg.index.cells, progress=progress if len(vectors) > 500_000 else None)
    built = time.perf_counter() - started - embedded
    info = {"model_sha256": sha256_file(path), "extractor": extractor, **ann.describe(index),
            "embed_s": round(embedded, 2), "build_s": round(built, 2)}  # fmt: skip
    folder = index_files.write_index(wd, dataset, name, index, image_ids, info)
    logger().info("index of %s images (%s) in %s: %.1f s", f"{len(image_ids):,}", info["kind"], folder, embedded + built, extra=SHOWN)
    return {"images": len(image_ids), **{k: v for k, v in info.items() if k != "model_sha256"}, "dir": str(folder)}
