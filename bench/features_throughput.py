"""Feature-extraction throughput: the features stage against a bare loop of the same
model, batch size and images, as a ratio, in one run.

    python bench/features_throughput.py [--device cpu|cuda] [--demo-images N] [--paper-images N]

stage: the stage's own shard path (stages.features.extract_shard): decoding threads, the
    model in channels-last inference mode, the Parquet part written at the end.
bare:  decode, crop and run the model one batch after another in one thread, writing
    nothing: what the hardware does with no pipeline around it.
Settings: the demo preset's extractor, and the paper's (ResNet-152, 10 crops of 448 px,
random weights: the speed does not depend on them) on Flickr-sized JPEGs (500 x 375).
"""

from __future__ import annotations

import argparse
import os
import platform
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

import pyarrow as pa
import torch
from PIL import Image

from mule.config.resolution import resolve
from mule.data_catalog.schemas import IMAGES
from mule.data_catalog.tables import Catalog
from mule.data_catalog.weights import load_extractor
from mule.mule_core.backbones import crop_transform, extract, numerics
from mule.mule_core.devices import resolve_device, torch_threads
from mule.mule_core.onnx_engine import OnnxExtractor
from mule.storage.workdir import Workdir
from mule.tasks.features import batch_size_for, extract_shard, loader_workers_for

SETTINGS = {"demo": {}, "paper": {"features.weights": "random"}}


def write_images(folder: Path, n: int, size: tuple[int, int], scenes: bool) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    if scenes:  # the demo's own images: rendered scenes of the embedded dataset
        from mule.generators.multi30k_layout import EmbeddedSpec, generate_image
        from mule.generators.scenes import render_scene

        spec = EmbeddedSpec()
        for i in range(n):
            path = folder / f"scene-{i}.jpg"
            render_scene(generate_image(spec, "test", i + 1)[3], spec.image_size).save(path, quality=90)
            paths.append(path)
        return paths
    for i in range(n):  # photo-sized noise: decoding costs what a Flickr JPEG costs
        path = folder / f"photo-{i}.jpg"
        Image.effect_noise(size, 40 + i % 20).convert("RGB").save(path, quality=90)
        paths.append(path)
    return paths


def catalog_with(workdir: Workdir, paths: list[Path]) -> None:
    n = len(paths)
    Catalog(workdir).write_table("images", "bench", pa.table(
        {"dataset": ["bench"] * n, "image_id": [p.stem for p in paths], "file_name": [p.name for p in paths],
         "path": [str(p) for p in paths], "split": ["test"] * n, "role": ["test"] * n, "exists": [True] * n,
         "sha256": [None] * n, "width": [0] * n, "height": [0] * n}, schema=IMAGES))  # fmt: skip


def bare_loop(model, transform, paths: list[Path], batch: int, device: torch.device) -> float:
    with torch_threads(1 if isinstance(model, OnnxExtractor) else torch.get_num_threads()):  # as the stage runs it
        return _bare_loop(model, transform, paths, batch, device)


def _bare_loop(model, transform, paths: list[Path], batch: int, device: torch.device) -> float:
    started = time.perf_counter()
    for b in range(0, len(paths), batch):
        crops = []
        for path in paths[b : b + batch]:
            with Image.open(path) as image:
                crops.append(transform(image))
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
            extract(model, torch.stack(crops).to(device)).cpu()
    if device.type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="auto")
    parser.add_argument("--demo-images", type=int, default=600)
    parser.add_argument("--paper-images", type=int, default=6)
    parser.add_argument("--loader-workers", type=int, default=-1, help="decoding threads (default: the stage's)")
    args = parser.parse_args()
    device = resolve_device(args.device)
    print(f"machine: {platform.node()}, {os.cpu_count()} CPUs, {platform.processor() or platform.machine()}, "
          f"device {device}, torch {torch.__version__} ({torch.get_num_threads()} threads)")  # fmt: skip
    print(f"{'setting':<7} {'extractor':<44} {'batch':>5} {'threads':>7} {'images':>6} {'stage/s':>8} "
          f"{'bare/s':>8} {'ratio':>6}")  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="mule-bench-features-") as tmp:
        for name, extra in SETTINGS.items():
            cfg = resolve(name, {**extra, "features.device": str(device), "data.dataset": "bench",
                                 "features.loader_workers": args.loader_workers})  # fmt: skip
            f = cfg.features
            n = args.demo_images if name == "demo" else args.paper_images
            paths = write_images(Path(tmp) / name, n, (500, 375), scenes=name == "demo")
            workdir = Workdir.at(Path(tmp) / f"work-{name}")
            catalog_with(workdir, paths)
            # the identity's record, as the stage's plan writes it (a worker checks its numerics)
            Catalog(workdir).write_extractor_info("bench", "bench-extractor", {"numerics": numerics(device)})
            model, _ = load_extractor(f, device)
            transform = crop_transform(f.input_size, f.resize, f.crops)
            batch = batch_size_for(f, device, torch.get_num_threads())
            bare_loop(model, transform, paths[: max(1, batch)], batch, device)  # warm-up
            shard = {"name": "bench", "images": [(p.stem, str(p), None) for p in paths], "offset": 0}
            stage = extract_shard(str(workdir.root), asdict(f), "bench", "bench-extractor", shard, n)["seconds"]
            bare = bare_loop(model, transform, paths, batch, device)
            extractor = f"{f.arch} {f.weights} {f.crops}x{f.input_size}px {f.pool}"
            print(f"{name:<7} {extractor:<44} {batch:>5} {loader_workers_for(f, device):>7} {n:>6} {n / stage:>8.1f} "
                  f"{n / bare:>8.1f} {bare / stage:>6.2f}", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
