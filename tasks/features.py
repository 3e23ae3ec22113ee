"""Image features: an ImageNet CNN over every image file of the dataset, written to the
features table in parts keyed by (image, extractor). A rerun skips what is there.

Three tasks, so the features flow can spread the work: `plan_features` lists what is left
and cuts it into shards, `extract_shard` runs the CNN over one shard and writes its
part (in this process, or on a Dask worker that sees the same files), `finish_features`
records the rejects and the summary. A missing file or one that does not decode is a
reject with its path and reason, never the end of the stage.
"""

from __future__ import annotations

import os
import platform
import threading
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from importlib.metadata import version
from typing import Any

import numpy as np
import pyarrow as pa
import torch
from prefect import task
from prefect.cache_policies import NO_CACHE

from data_catalog import queries
from data_catalog.catalog import Catalog
from data_catalog.images import BadImage, load_rgb
from data_catalog.pretrained import imagenet_weights
from data_catalog.schemas import REJECTS
from experiments.tracking import Tracker
from mule_core import onnx_engine
from mule_core.config import ConfigError, FeaturesConfig
from mule_core.errors import UserError
from mule_core.features import (
    backbone,
    build_backbone,
    crop_transform,
    extract,
    extractor_name,
    prepare_for_inference,
    resize_for,
)
from mule_core.progress import Progress
from mule_core.training import resolve_device

from .common import context, logger


class NoImagesError(UserError, RuntimeError):
    pass


class ImageRejectedError(UserError, RuntimeError):
    pass


def extractor_for(cfg: FeaturesConfig) -> str:
    return extractor_name(cfg.arch, cfg.weights, cfg.input_size, cfg.resize, cfg.crops, cfg.seed, cfg.pool)


def batch_size_for(cfg: FeaturesConfig, device: torch.device) -> int:
    """Images per forward pass. On the CPU small batches stay in cache (32 crops of 224 px
    run at two thirds of the speed of 4 with EfficientNet-Lite0 on 2 cores); a GPU wants hundreds of crops."""
    if cfg.batch_size > 0:
        return cfg.batch_size
    pixels = (cfg.input_size / 224) ** 2 * cfg.crops  # in 224-px crops
    budget = 256 if device.type == "cuda" else 4
    return max(1, int(budget / pixels))


def loader_workers_for(cfg: FeaturesConfig, device: torch.device) -> int:
    """Decoding threads: the user's number; else, beside a GPU, one per spare core. On the
    CPU the network already uses every core, and a decoding thread beside it costs more
    than it hides (measured: stage/bare loop 0.87 with one thread, 0.98 inline, 2 cores)."""
    if cfg.loader_workers >= 0:
        return cfg.loader_workers
    return min(8, max(1, (os.cpu_count() or 1) - 1)) if device.type == "cuda" else 0


class _ImageFiles:
    """(position, crops or None, error or None): a file that fails to open or decode is
    reported, not raised, so one bad JPEG never stops the stage."""

    def __init__(self, paths: list[str], transform):
        self.paths, self.transform = paths, transform

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, index: int):
        path = self.paths[index]
        try:
            image = load_rgb(path, min_side=self.transform.shorter_side)
        except FileNotFoundError:
            return index, None, "image file missing"
        except BadImage as error:
            return index, None, f"image does not decode: {error.reason}"
        with image:
            return index, self.transform(image), None


def _collate(items):
    good = [(i, t) for i, t, e in items if e is None]
    bad = [(i, e) for i, _, e in items if e is not None]
    crops = torch.stack([t for _, t in good]) if good else None
    return [i for i, _ in good], crops, bad


def prefetched_batches(files: _ImageFiles, batch_size: int, threads: int, depth: int = 2):
    """Batches of (positions, crops, rejects), decoded and cropped by a thread pool while
    the model works on the batch before; at most `depth` batches wait in memory.

    Threads, not DataLoader processes: Pillow and torch release the GIL while decoding,
    resizing and normalising, and forked workers die inside Prefect's task process and
    cannot start at all inside Dask's (daemonic) workers."""
    starts = range(0, len(files), batch_size)
    if threads == 0:
        for b in starts:
            yield _collate([files[i] for i in range(b, min(b + batch_size, len(files)))])
        return
    with ThreadPoolExecutor(threads, thread_name_prefix="decode") as pool:
        pending: deque = deque()
        for b in starts:
            pending.append([pool.submit(files.__getitem__, i) for i in range(b, min(b + batch_size, len(files)))])
            if len(pending) > depth:
                yield _collate([f.result() for f in pending.popleft()])
        while pending:
            yield _collate([f.result() for f in pending.popleft()])


def images_with_files(catalog: Catalog, dataset: str) -> tuple[list[str], list[str], list[dict]]:
    """(image ids with a file, their paths, rows of the images without one)."""
    rows = queries.image_rows(catalog, dataset)
    present = [r for r in rows if r["exists"]]
    if not present:
        folder = rows[0]["path"].rsplit("/", 1)[0] if rows else "?"
        raise NoImagesError(
            f"dataset {dataset!r} has no image files ({len(rows)} images listed, none found under {folder}). "
            "The image stages (features, train, evaluate) need the images; text-only stages "
            "(ingest, text, pretrain) work without them. Point --images at the image folder "
            "(for Multi30K: the Flickr30K images) and rerun ingest."
        )
    return [r["image_id"] for r in present], [r["path"] for r in present], [r for r in rows if not r["exists"]]


# One model per process and setting: shards run one after another (or on a Dask worker)
# and must not reload the weights each time.
_MODELS: dict[tuple, tuple[torch.nn.Module, dict]] = {}
_MODELS_LOCK = threading.Lock()


def engine_for(f: FeaturesConfig, device: torch.device) -> str:
    if f.engine == "onnxruntime" and device.type != "cpu":
        raise ConfigError("features.engine=onnxruntime runs on the CPU; use features.engine=torch on CUDA")
    if f.engine == "onnxruntime" and not onnx_engine.available():
        raise ConfigError("features.engine=onnxruntime needs the onnxruntime package: pip install onnxruntime")
    if f.engine == "auto":
        return "onnxruntime" if device.type == "cpu" and onnx_engine.available() else "torch"
    return f.engine


def load_extractor(f: FeaturesConfig, device: torch.device):
    """(the network or its ONNX Runtime twin, description of its weights and engine)."""
    engine = engine_for(f, device)
    key = (f.arch, f.weights, f.weights_file, f.seed, f.pool, f.input_size, str(device), engine)
    with _MODELS_LOCK:
        if key not in _MODELS:
            if f.weights == "imagenet":
                state, weights_info = imagenet_weights(f.arch, f.weights_file)  # a clear error offline
            else:
                state, weights_info = None, {"weights": f"random (seed {f.seed})"}
            model = build_backbone(f.arch, state, f.seed, f.pool)
            if engine == "onnxruntime":
                model = onnx_engine.OnnxExtractor(model, f.input_size, torch.get_num_threads())
            else:
                model = prepare_for_inference(model, device)
            _MODELS[key] = (model, weights_info | {"engine": engine})
        return _MODELS[key]


def device_for_worker(device: torch.device) -> torch.device:
    """On a Dask LocalCluster with several GPUs, worker n uses GPU n (mod the count)."""
    if device.type != "cuda" or device.index is not None or torch.cuda.device_count() < 2:
        return device
    try:
        from distributed import get_worker

        name = get_worker().name
    except (ImportError, ValueError):  # not on a Dask worker
        return device
    return torch.device("cuda", name % torch.cuda.device_count()) if isinstance(name, int) else device


@task(name="plan-features", cache_policy=NO_CACHE)
def plan_features(workdir: str, config: dict[str, Any]) -> dict[str, Any]:
    """What is left to extract, cut into shards; the extractor's description."""
    wd, catalog, cfg = context(workdir, config)
    log, f, dataset = logger(), cfg.features, cfg.data.dataset
    extractor = extractor_for(f)
    image_ids, paths, without_file = images_with_files(catalog, dataset)
    if without_file:
        log.warning("%d of %d images have no file; extracting the %d present (the others go to rejects)",
                    len(without_file), len(without_file) + len(image_ids), len(image_ids))  # fmt: skip
    device = resolve_device(f.device)
    _, weights_info = load_extractor(f, device)  # fails fast (offline weights) before any work
    info = {
        "extractor": extractor, "arch": f.arch, **weights_info, "input_size": f.input_size,
        "resize": resize_for(f.input_size, f.resize), "crops": f.crops, "pool": f.pool,
        "normalisation": {"mean": backbone(f.arch).mean, "std": backbone(f.arch).std},
        "torch": torch.__version__, "torchvision": version("torchvision"), "device": str(device),
        "host": platform.node(),
    }  # fmt: skip
    catalog.write_extractor_info(dataset, extractor, info)
    # An image is done when its features came from the bytes it has now: a file replaced
    # under the same name is extracted again (and its old row dropped in finish_features).
    done = catalog.extracted_images(dataset, extractor)
    sha_of = queries.image_digests(catalog, dataset)
    todo = [(i, p, sha_of[i]) for i, p in zip(image_ids, paths) if i not in done or done[i] != sha_of[i]]
    changed = sum(1 for i, _, _ in todo if i in done)
    log.info("extractor %s: %d images to extract (%d whose file changed), %d already done", extractor, len(todo),
             changed, len(image_ids) - len(todo))  # fmt: skip
    stamp = time.strftime("%Y%m%dT%H%M%S")
    shards = [{"name": f"{stamp}-{n:05d}", "images": todo[b : b + f.shard_images], "offset": b}
              for n, b in enumerate(range(0, len(todo), f.shard_images))]  # fmt: skip
    missing = [{"path": r["path"], "reason": "image file missing"} for r in without_file]
    return {"extractor": extractor, "info": info, "images": len(image_ids) + len(without_file), "todo": len(todo),
            "shards": shards, "missing": missing, "changed": [i for i, _, _ in todo if i in done]}  # fmt: skip


def run_shard(workdir: str, config: dict[str, Any], shard: dict, total: int) -> dict[str, Any]:
    """The CNN over one shard's images; writes its part; returns its rejects and timing."""
    wd, catalog, cfg = context(workdir, config)
    f, dataset = cfg.features, cfg.data.dataset
    device = device_for_worker(resolve_device(f.device))
    model, _ = load_extractor(f, device)
    image_ids = [i for i, _, _ in shard["images"]]
    paths = [p for _, p, _ in shard["images"]]
    sha_of = {i: sha for i, _, sha in shard["images"]}
    files = _ImageFiles(paths, crop_transform(f.input_size, f.resize, f.crops))
    loader = prefetched_batches(files, batch_size_for(f, device), loader_workers_for(f, device))
    progress = Progress(f"features ({f.arch}, {f.crops} crop(s) of {f.input_size}px)", total, "images", logger(),
                        done=shard["offset"])  # fmt: skip
    kept, vectors, rejects = [], [], []
    started = time.perf_counter()
    for positions, crops, bad in loader:
        rejects += [{"path": paths[i], "reason": reason} for i, reason in bad]
        if crops is not None:
            crops = crops.to(device, non_blocking=True)
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
                vectors.append(extract(model, crops).cpu())
            kept += [image_ids[i] for i in positions]
        progress.update(len(positions) + len(bad))
    if kept:
        catalog.write_feature_part(dataset, extractor_for(f), kept, torch.cat(vectors).numpy(), name=shard["name"],
                                   image_sha256=[sha_of[i] for i in kept])  # fmt: skip
    return {"extracted": len(kept), "rejects": rejects, "seconds": time.perf_counter() - started,
            "part": f"part-{shard['name']}.parquet" if kept else None, "image_ids": kept}  # fmt: skip


@task(name="extract-shard", cache_policy=NO_CACHE)
def extract_shard(workdir: str, config: dict[str, Any], shard: dict, total: int) -> dict[str, Any]:
    return run_shard(workdir, config, shard, total)


def write_image_rejects(catalog: Catalog, dataset: str, root: str, rejects: list[dict]) -> None:
    """Image rejects beside ingest's, in the same table (rejects/<dataset>.images.parquet)."""
    prefix = root.rstrip("/") + "/"
    table = pa.table(
        {"dataset": [dataset] * len(rejects),
         "source_file": [r["path"].removeprefix(prefix) for r in rejects],
         "line": pa.nulls(len(rejects), pa.int32()),
         "kind": ["missing_image" if r["reason"] == "image file missing" else "bad_image" for r in rejects],
         "reason": [r["reason"] for r in rejects],
         "raw": [""] * len(rejects),
         "raw_bytes": [b""] * len(rejects)},
        schema=REJECTS,
    )  # fmt: skip
    catalog.write_table("rejects", f"{dataset}.images", table)


@task(name="finish-features", cache_policy=NO_CACHE)
def finish_features(workdir: str, config: dict[str, Any], run_id: str | None, plan: dict,
                    shards: list[dict]) -> dict[str, Any]:  # fmt: skip
    wd, catalog, cfg = context(workdir, config)
    log, dataset, extractor, info = logger(), cfg.data.dataset, plan["extractor"], plan["info"]
    rejects = plan["missing"] + [r for s in shards for r in s["rejects"]]
    root = str(wd.raw_dir(dataset)) if not cfg.data.source else cfg.data.source
    write_image_rejects(catalog, dataset, str(os.path.realpath(root)), rejects)
    extracted = sum(s["extracted"] for s in shards)
    seconds = sum(s["seconds"] for s in shards)
    if rejects and cfg.data.strict:
        raise ImageRejectedError(f"{rejects[0]['path']}: {rejects[0]['reason']} (and {len(rejects) - 1} more images; "
                                 "data.strict=true makes this an error)")  # fmt: skip
    if rejects:
        log.warning("%d images rejected (missing or not decodable; see the rejects table), e.g. %s: %s",
                    len(rejects), rejects[0]["path"], rejects[0]["reason"])  # fmt: skip
    replaced = set(plan["changed"]) & {i for s in shards for i in s["image_ids"]}
    if replaced:  # the features of the old bytes go; the new ones are in this run's parts
        catalog.drop_superseded_features(dataset, extractor, replaced, {s["part"] for s in shards if s["part"]})
        log.info("%d images whose file changed were extracted again: %s", len(replaced),
                 ", ".join(sorted(replaced)[:5]) + (", ..." if len(replaced) > 5 else ""))  # fmt: skip
    catalog.refresh_views()
    with_features = len(catalog.extracted_image_ids(dataset, extractor))
    if not with_features:
        raise NoImagesError(f"none of the {plan['images']} images of {dataset!r} could be read; see the rejects table")
    dim = queries.feature_dim(catalog, extractor)
    rate = round(extracted / seconds, 1) if extracted and seconds > 0 else None
    summary = {"extractor": extractor, "dim": dim, "images": with_features, "extracted_now": extracted,
               "extracted_again": sorted(replaced),
               "rejected": len(rejects), "images_per_second": rate, **info}  # fmt: skip
    tracker = Tracker(wd, run_id)
    tracker.tags({"mule.extractor": extractor, "mule.weights": info["weights"]})
    tracker.params({"features.extractor": extractor, "features.weights_used": info["weights"],
                    "features.weights_file_used": info.get("file", ""),
                    "features.weights_sha256": info.get("sha256", "")})  # fmt: skip
    tracker.metrics({"images": with_features, "extracted_now": extracted, "rejected": len(rejects), "dim": dim,
                     "images_per_second": rate or float("nan")})  # fmt: skip
    tracker.json(info, "extractor.json")
    return summary


def extract_features(workdir: str, config: dict[str, Any], run_id: str | None) -> dict[str, Any]:
    """The whole stage in this process, shard after shard (what the features flow does
    with the default runner; also used by the ablation and the benchmarks)."""
    plan = plan_features(workdir, config)
    shards = [extract_shard(workdir, config, shard, plan["todo"]) for shard in plan["shards"]]
    return finish_features(workdir, config, run_id, plan, shards)


def feature_matrix(catalog: Catalog, dataset: str, extractor: str, image_ids: list[str]) -> np.ndarray:
    return catalog.read_features(dataset, extractor, image_ids)
