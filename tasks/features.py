"""Image features: a torchvision ResNet over every image file of the dataset, written to
the features table in parts keyed by (image, extractor). A rerun skips what is there."""

from __future__ import annotations

import platform
import time
from typing import Any

import numpy as np
import torch
import torchvision
from PIL import Image
from prefect import task
from prefect.cache_policies import NO_CACHE
from torch.utils.data import DataLoader, Dataset

from data_catalog.catalog import Catalog
from data_catalog.pretrained import imagenet_weights
from mule_core.config import FeaturesConfig
from mule_core.features import build_resnet, crop_transform, extract, extractor_name, resize_for
from mule_core.progress import Progress
from mule_core.training import resolve_device

from .common import context, logger
from .tracking import Tracker


class NoImagesError(RuntimeError):
    pass


def extractor_for(cfg: FeaturesConfig) -> str:
    return extractor_name(cfg.arch, cfg.weights, cfg.input_size, cfg.resize, cfg.crops, cfg.seed)


class _ImageFiles(Dataset):
    def __init__(self, paths: list[str], transform):
        self.paths, self.transform = paths, transform

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, index: int) -> torch.Tensor:
        with Image.open(self.paths[index]) as image:
            return self.transform(image)


def image_file_count(catalog: Catalog, dataset: str) -> int:
    return int(catalog.query(
        '''SELECT count(*) AS n FROM images WHERE dataset = ? AND "exists"''', [dataset])["n"][0].as_py())  # fmt: skip


def images_with_files(catalog: Catalog, dataset: str) -> tuple[list[str], list[str], int]:
    rows = catalog.query(
        'SELECT image_id, path, "exists" FROM images WHERE dataset = ? ORDER BY image_id', [dataset]
    ).to_pylist()
    present = [r for r in rows if r["exists"]]
    if not present:
        folder = rows[0]["path"].rsplit("/", 1)[0] if rows else "?"
        raise NoImagesError(
            f"dataset {dataset!r} has no image files ({len(rows)} images listed, none found under {folder}). "
            "The image stages (features, train, evaluate) need the images; text-only stages "
            "(ingest, text, pretrain) work without them. Point --images at the image folder "
            "(for Multi30K: the Flickr30K images) and rerun ingest."
        )
    return [r["image_id"] for r in present], [r["path"] for r in present], len(rows)


@task(name="extract-features", cache_policy=NO_CACHE)
def extract_features(workdir: str, config: dict[str, Any], run_id: str | None) -> dict[str, Any]:
    wd, catalog, cfg = context(workdir, config)
    log, f, dataset = logger(), cfg.features, cfg.data.dataset
    extractor = extractor_for(f)
    image_ids, paths, listed = images_with_files(catalog, dataset)
    if len(image_ids) < listed:
        log.warning(
            "%d of %d images have no file; extracting the %d present", listed - len(image_ids), listed, len(image_ids)
        )

    if f.weights == "imagenet":
        state, weights_info = imagenet_weights(f.arch)  # raises a clear error offline
    else:
        state, weights_info = None, {"weights": f"random (seed {f.seed})"}
    device = resolve_device(f.device)
    model = build_resnet(f.arch, state, f.seed).to(device)
    if device.type == "cuda":
        model = model.to(memory_format=torch.channels_last)
    info = {
        "extractor": extractor, "arch": f.arch, **weights_info, "input_size": f.input_size,
        "resize": resize_for(f.input_size, f.resize), "crops": f.crops, "torch": torch.__version__,
        "torchvision": torchvision.__version__, "device": str(device), "host": platform.node(),
    }  # fmt: skip
    catalog.write_extractor_info(dataset, extractor, info)

    done = catalog.extracted_image_ids(dataset, extractor)
    todo = [(i, p) for i, p in zip(image_ids, paths) if i not in done]
    log.info("extractor %s: %d images to extract, %d already done", extractor, len(todo), len(done))
    transform = crop_transform(f.input_size, f.resize, f.crops)
    progress = Progress(f"features ({f.arch}, {f.crops} crop(s) of {f.input_size}px)", len(todo), "images", log)
    started = time.perf_counter()
    for begin in range(0, len(todo), f.shard_images):
        shard = todo[begin : begin + f.shard_images]
        loader = DataLoader(_ImageFiles([p for _, p in shard], transform), batch_size=f.batch_size,
                            num_workers=f.loader_workers, pin_memory=device.type == "cuda")  # fmt: skip
        vectors = []
        for crops in loader:
            crops = crops.to(device, non_blocking=True)
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
                vectors.append(extract(model, crops).cpu())
            progress.update(len(crops))
        catalog.write_feature_part(dataset, extractor, [i for i, _ in shard], torch.cat(vectors).numpy())
    seconds = time.perf_counter() - started
    if todo:
        progress.finish()
    catalog.refresh_views()
    dim = int(
        catalog.query("SELECT len(vector) AS d FROM features WHERE extractor = ? LIMIT 1", [extractor])["d"][0].as_py()
    )
    summary = {"extractor": extractor, "dim": dim, "images": len(image_ids), "extracted_now": len(todo),
               "images_per_second": round(len(todo) / seconds, 1) if todo and seconds > 0 else None, **info}  # fmt: skip
    tracker = Tracker(wd, run_id)
    tracker.tags({"mule.extractor": extractor, "mule.weights": info["weights"]})
    tracker.params({"features.extractor": extractor, "features.weights_used": info["weights"],
                    "features.weights_sha256": info.get("sha256", "")})  # fmt: skip
    tracker.metrics({"images": len(image_ids), "extracted_now": len(todo), "dim": dim,
                     "images_per_second": summary["images_per_second"] or float("nan")})  # fmt: skip
    tracker.json(info, "extractor.json")
    return summary


def feature_matrix(catalog: Catalog, dataset: str, extractor: str, image_ids: list[str]) -> np.ndarray:
    return catalog.read_features(dataset, extractor, image_ids)
