"""Image features: an ImageNet CNN over every image file of the dataset, written to the
features table in parts, under the extractor's identity.

The identity (`extractor_identity`) is everything that made the vectors: the setting
(architecture, weights, input size, crops, pooling), the weights file's SHA-256 and the
extraction code's key (tasks/shared/extraction.py's import closure, with its libraries'
versions). New weights, an edit to the extraction code or a torch upgrade is a new
identity, extracted anew; the old vectors stay readable (a model trained on them still
finds them) until removed. Within one identity, a rerun extracts what is missing: new
images, images whose file changed (their old rows are dropped), the parts an
interrupted run did not write; `--force features` extracts every image again.

Three steps, so the features flow can spread the work: `plan_features` lists what is
left and cuts it into shards, `extract_shard` runs the CNN over one shard and writes its
part (in this process, or on a Dask worker that sees the same files), `finish_features`
records the rejects and points the catalog at the identity. A missing file or one that
does not decode is a reject with its path and reason, never the end of the stage.
"""

from __future__ import annotations

import os
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from importlib.metadata import version
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import torch

from mule.data_catalog import queries
from mule.data_catalog.schemas import REJECTS
from mule.data_catalog.tables import Catalog, write_json_atomic
from mule.data_catalog.weights import load_extractor
from mule.mule_core.backbones import ExtractorError, backbone, engine_for, numerics
from mule.mule_core.devices import resolve_device, torch_threads
from mule.mule_core.errors import UserError
from mule.mule_core.extractor_names import identity_name, resize_for, setting
from mule.mule_core.onnx_engine import OnnxExtractor
from mule.mule_core.progress import SHOWN, Progress
from mule.storage.code_digests import code_parts
from mule.storage.locks import run_token, still_running
from mule.storage.workdir import Workdir
from mule.tasks.shared import extraction
from mule.tasks.shared.context import NoImagesError, StageContext, images_with_files, logger

if TYPE_CHECKING:
    from mule.config.sections import FeaturesConfig

FORCED = "forced.json"  # in an identity's folder while a forced extraction is unfinished
# Below this many photos, the stage says that 10 crops each paid off on real photos (a
# tenth of the time per crop matters little there; at Multi30K's 31,014 it is an hour here).
FEW_PHOTOS = 2000


class ImageRejectedError(UserError, RuntimeError):
    pass


def extractor_identity(f: FeaturesConfig, weights: dict, arithmetic: str) -> tuple[str, dict]:
    """(the identity's name, what it is made of). `weights`: the description of the weights
    the network was loaded with (data_catalog.weights: their file's sha256, or the seed);
    `arithmetic`: mule_core.backbones.numerics of the device it runs on."""
    made_of = {"weights_digest": weights.get("sha256") or weights["weights"],
               "code": code_parts(extraction.__name__), "numerics": arithmetic}  # fmt: skip
    return identity_name(f, made_of), {"setting": setting(f.arch, f.weights, f.input_size, f.resize, f.crops,
                                                          f.seed, f.pool), **made_of}  # fmt: skip


def batch_size_for(f: FeaturesConfig, device: torch.device, threads: int = 1) -> int:
    """Images per forward pass. A GPU wants hundreds of crops. On the CPU small batches
    stay in cache: ONNX Runtime gets one 224-px crop for each of its `threads`, each
    thread running its own (mule_core/onnx_engine.py); PyTorch 4 (32 crops of 224 px ran at
    two thirds of the speed of 4 with EfficientNet-Lite0 on 2 cores)."""
    if f.batch_size > 0:
        return f.batch_size
    pixels = (f.input_size / 224) ** 2 * f.crops  # in 224-px crops
    if device.type == "cuda":
        budget = 256
    else:
        budget = threads if engine_for(f, device) == "onnxruntime" else 4
    return max(1, int(budget / pixels))


def loader_workers_for(f: FeaturesConfig, device: torch.device) -> int:
    """Decoding threads: the user's number; else, beside a GPU, one per spare core. On the
    CPU the network already uses every core, and a decoding thread beside it costs more
    than it hides (measured: stage/bare loop 0.87 with one thread, 0.98 inline, 2 cores)."""
    if f.loader_workers >= 0:
        return f.loader_workers
    return min(8, max(1, (os.cpu_count() or 1) - 1)) if device.type == "cuda" else 0


def prefetched_batches(files: extraction.ImageCrops, batch_size: int, threads: int, depth: int = 2):
    """Batches of (positions, crops, rejects), decoded and cropped by a thread pool while
    the model works on the batch before; at most `depth` batches wait in memory.

    Threads, not DataLoader processes: Pillow and torch release the GIL while decoding,
    resizing and normalising, and forked workers die inside Prefect's task process and
    cannot start at all inside Dask's (daemonic) workers."""
    starts = range(0, len(files), batch_size)
    if threads == 0:
        for b in starts:
            yield extraction.collate([files[i] for i in range(b, min(b + batch_size, len(files)))])
        return
    with ThreadPoolExecutor(threads, thread_name_prefix="decode") as pool:
        pending: deque = deque()
        for b in starts:
            pending.append([pool.submit(files.__getitem__, i) for i in range(b, min(b + batch_size, len(files)))])
            if len(pending) > depth:
                yield extraction.collate([f.result() for f in pending.popleft()])
        while pending:
            yield extraction.collate([f.result() for f in pending.popleft()])


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


def plan_features(ctx: StageContext) -> dict[str, Any]:
    """The identity to write under, what is left to extract there cut into shards."""
    catalog, cfg = ctx.catalog, ctx.cfg
    log, f, dataset = logger(), cfg.features, cfg.data.dataset
    image_ids, paths, without_file = images_with_files(catalog, dataset)
    if without_file:
        log.warning("%d of %d images have no file; extracting the %d present (the others go to rejects)",
                    len(without_file), len(without_file) + len(image_ids), len(image_ids))  # fmt: skip
    device = resolve_device(f.device)
    _, weights = load_extractor(f, device)  # fails fast (offline weights) before any work
    identity, made_of = extractor_identity(f, weights, numerics(device, engine_for(f, device)))
    folder = ctx.workdir.features_dir(dataset, identity)
    catalog.write_extractor_info(dataset, identity, {
        "extractor": identity, **made_of, "arch": f.arch, "weights": weights["weights"],
        "weights_file": weights.get("file", ""), "weights_sha256": weights.get("sha256", ""),
        "input_size": f.input_size, "resize": resize_for(f.input_size, f.resize), "crops": f.crops, "pool": f.pool,
        "normalisation": {"mean": backbone(f.arch).mean, "std": backbone(f.arch).std},
        "torch": torch.__version__, "torchvision": version("torchvision"),
    })  # fmt: skip
    stamp = time.strftime("%Y%m%dT%H%M%S") + f"{time.time_ns() // 1000 % 1_000_000:06d}"
    forced = folder / FORCED
    if ctx.force:  # every image again; an interrupted forced run resumes after its own parts
        write_json_atomic({"since": f"part-{stamp}"}, forced)
    since = _read_since(forced)
    for part in catalog.drop_damaged_parts(dataset, identity):
        log.warning("feature part %s was unreadable (damaged): removed, its images are extracted again", part)
    # An image is done when its features came from the bytes it has now: a file replaced
    # under the same name is extracted again (and its old row dropped in finish_features).
    done = catalog.extracted_images(dataset, identity, since=since)
    stored = catalog.extracted_images(dataset, identity) if since else done
    sha_of = queries.image_digests(catalog, dataset)
    todo = [(i, p, sha_of[i]) for i, p in zip(image_ids, paths) if i not in done or done[i] != sha_of[i]]
    changed = [i for i, _, _ in todo if i in stored]
    log.info("extractor %s: %d images to extract (%d extracted before%s), %d already done", identity, len(todo),
             len(changed), ", forced" if since else "", len(image_ids) - len(todo), extra=SHOWN)  # fmt: skip
    run = run_token(ctx.workdir)  # a worker elsewhere writes only while this run holds the workdir
    shards = [{"name": f"{stamp}-{n:05d}", "images": todo[b : b + f.shard_images], "offset": b, "run": run}
              for n, b in enumerate(range(0, len(todo), f.shard_images))]  # fmt: skip
    missing = [{"path": r["path"], "reason": "image file missing"} for r in without_file]
    return {"extractor": identity, "weights": weights, "images": len(image_ids) + len(without_file),
            "todo": len(todo), "shards": shards, "missing": missing, "changed": changed, "forced": bool(since)}  # fmt: skip


def _read_since(forced) -> str:
    import json

    try:
        return json.loads(forced.read_text())["since"]
    except (OSError, ValueError, KeyError):
        return ""


def extract_shard(workdir: str, features: dict, dataset: str, identity: str, shard: dict, total: int) -> dict:
    """The CNN over one shard's images; writes its part; returns its rejects and timing.
    Plain arguments: it may run on a Dask worker (`features`: the features section's options)."""
    from types import SimpleNamespace

    f = SimpleNamespace(**features)
    catalog = Catalog(Workdir.at(workdir))
    device = device_for_worker(resolve_device(f.device))
    made_by = catalog.extractor_info(dataset, identity) or {}
    if made_by.get("numerics") != numerics(device, engine_for(f, device)):  # a Dask worker on another device
        raise ExtractorError(f"features {identity} are computed in {made_by.get('numerics')}, and this worker's "
                             f"{device} computes in {numerics(device, engine_for(f, device))}: their vectors would differ; give the "
                             "cluster's workers one kind of device, or features.device")  # fmt: skip
    net, _ = load_extractor(f, device)
    if isinstance(net, OnnxExtractor):
        net.use_threads(torch.get_num_threads())
    image_ids = [i for i, _, _ in shard["images"]]
    paths = [p for _, p, _ in shard["images"]]
    sha_of = {i: sha for i, _, sha in shard["images"]}
    threads = torch.get_num_threads()
    batches = prefetched_batches(extraction.ImageCrops(paths, f), batch_size_for(f, device, threads),
                                 loader_workers_for(f, device))  # fmt: skip
    # in this process after the shards before it (`started`: when the first began), else alone (a Dask worker)
    together = "started" in shard
    progress = Progress(f"features ({f.arch}, {f.crops} crop(s) of {f.input_size}px)", total, "images", logger(),
                        done=shard["offset"], base=0 if together else None,
                        started=shard["started"] if together else None)  # fmt: skip
    kept, vectors, rejects = [], [], []
    started = time.perf_counter()
    with torch_threads(1 if isinstance(net, OnnxExtractor) else torch.get_num_threads()):
        for positions, crops, bad in batches:
            rejects += [{"path": paths[i], "reason": reason} for i, reason in bad]
            if crops is not None:
                vectors.append(extraction.vectors(net, crops, device))
                kept += [image_ids[i] for i in positions]
            progress.update(len(positions) + len(bad))
    if kept and shard.get("run") and not still_running(catalog.workdir, shard["run"]):
        # a remote worker that finished after the run stopped (mule exited, or another run
        # holds the workdir now): its part is not written; that run's rerun extracts it
        logger().warning("features shard %s: the run that planned it no longer holds %s; its part is not written",
                         shard["name"], catalog.workdir.root)  # fmt: skip
        return {"extracted": 0, "rejects": [], "seconds": time.perf_counter() - started, "part": None,
                "image_ids": [], "discarded": True}  # fmt: skip
    if kept:
        import numpy as np

        catalog.write_feature_part(dataset, identity, kept, np.concatenate(vectors), name=shard["name"],
                                   image_sha256=[sha_of[i] for i in kept])  # fmt: skip
    return {"extracted": len(kept), "rejects": rejects, "seconds": time.perf_counter() - started,
            "part": f"part-{shard['name']}.parquet" if kept else None, "image_ids": kept}  # fmt: skip


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


def finish_features(ctx: StageContext, plan: dict, shards: list[dict]) -> dict[str, Any]:
    wd, catalog, cfg = ctx.workdir, ctx.catalog, ctx.cfg
    log, dataset, identity = logger(), cfg.data.dataset, plan["extractor"]
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
    new_parts = {s["part"] for s in shards if s["part"]}
    replaced = set(plan["changed"]) & {i for s in shards for i in s["image_ids"]}
    if replaced:  # the features of the old bytes (or of before --force) go; the new ones are in this run's parts
        catalog.drop_superseded_features(dataset, identity, replaced, new_parts)
        log.info("%d images extracted again: %s", len(replaced),
                 ", ".join(sorted(replaced)[:5]) + (", ..." if len(replaced) > 5 else ""))  # fmt: skip
    (wd.features_dir(dataset, identity) / FORCED).unlink(missing_ok=True)
    catalog.refresh_views()
    with_features = len(catalog.extracted_image_ids(dataset, identity))
    if not with_features:
        raise NoImagesError(f"none of the {plan['images']} images of {dataset!r} could be read; see the rejects table")
    catalog.set_current_extractor(dataset, cfg.features, identity)
    if with_features < FEW_PHOTOS and cfg.features.crops == 1 and extracted:
        log.info("%d images: with few photos, 10 crops each and 24 joint epochs gained +3.7 mR on folds of 872 "
                 "real ones (--preset few-photos; docs/real-photos.md)", with_features, extra=SHOWN)  # fmt: skip
    weights = plan["weights"]
    return {"extractor": identity, "dim": queries.feature_dim(catalog, identity), "images": with_features,
            "extracted_now": extracted, "extracted_again": sorted(replaced), "forced": plan["forced"],
            "rejected": len(rejects), "images_per_second": round(extracted / seconds, 1) if extracted and seconds else None,
            "weights": weights["weights"], "weights_file": weights.get("file", ""),
            "weights_sha256": weights.get("sha256", ""), "engine": weights.get("engine", ""),
            "device": str(resolve_device(cfg.features.device))}  # fmt: skip


def compute(ctx: StageContext) -> dict[str, Any]:
    """The whole stage in this process, shard after shard (what the features flow does
    with the default runner)."""
    plan = plan_features(ctx)
    f, dataset = ctx.cfg.features, ctx.dataset
    from dataclasses import asdict

    started = time.time()  # one after another: one progress line's rate and ETA over them all
    shards = [extract_shard(str(ctx.workdir.root), asdict(f), dataset, plan["extractor"], shard | {"started": started},
                            plan["todo"]) for shard in plan["shards"]]  # fmt: skip
    return finish_features(ctx, plan, shards)
