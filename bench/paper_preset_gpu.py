"""The paper preset end to end on a GPU machine that has torch but not mule's other
dependencies: ResNet-152 features (10 crops of 448 px) of every image, then LP and joint
training, with `train.amp` on and off: images/s, seconds per epoch, test mR.

    # here, beside the catalog: the text side of a workdir (ingest + text stages, paper preset)
    python bench/paper_preset_gpu.py prepare --workdir W --out in-paper.pt
    # on the GPU machine (random extractor weights when ImageNet's cannot be downloaded there)
    python bench/paper_preset_gpu.py run --inputs in-paper.pt [--weights random] [--fp32-images 1024]

`prepare` exports the splits' captions, vocabularies and word vectors (the workdir's
fastText, 300-d under the paper preset) and the checksums of a few image files. `run`
regenerates the embedded dataset's images from its generator (the same seed, so the same
files: the checksums are compared), extracts features through the features stage's own
crop and batch code (tasks/shared/extraction.py, bfloat16 autocast as the stage runs it on CUDA;
float32 timed on a subset), then trains the paper preset with LP as the train stage does
(bench/train_on_workdir.py), once per `train.amp`.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch
from checkout import use_checkout

use_checkout()  # run from anywhere, installed or not

from mule.config.resolution import resolve  # noqa: E402
from mule.mule_core.devices import resolve_device  # noqa: E402

DATA_KEYS = ("train_images", "val_images", "test_images", "seed", "image_size")


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def head(split, n: int):
    """The split's first n images and their captions (a smoke test of the whole path)."""
    keep = np.nonzero(split.caption_image < n)[0]
    index = torch.from_numpy(keep)
    group = split.caption_group[keep] if split.caption_group is not None else None
    return type(split)(split.languages, split.tokens[index], split.lengths[index], split.caption_lang[keep],
                       split.caption_image[keep], split.image_ids[:n], None, None, group)  # fmt: skip


def prepare(workdir: str, out: str) -> None:
    import train_on_workdir

    from mule.data_catalog import queries
    from mule.data_catalog.tables import Catalog
    from mule.storage.workdir import Workdir

    cfg = resolve("paper", {})
    train_on_workdir.export(workdir, "embedded", "paper", {}, out, 32, text_only=True)
    # the generator's settings, from the workdir's own record of the ingest run
    wd = Workdir.at(workdir)
    paths = queries.image_paths(Catalog(wd), "embedded")
    sample = sorted(paths)[:: max(1, len(paths) // 5)][:5]
    checks = {image: hashlib.sha256(Path(paths[image]).read_bytes()).hexdigest() for image in sample}
    data = torch.load(out, weights_only=False)
    data["embedded"] = {key: getattr(cfg.data, key) for key in DATA_KEYS} | {"checksums": checks}
    sizes = {name: len(entry["image_ids"]) for name, entry in data["splits"].items()}
    data["embedded"] |= {"train_images": sizes["train"], "val_images": sizes["val"], "test_images": sizes["test"]}
    torch.save(data, out)
    print(f"{out}: {Path(out).stat().st_size / 2**20:.1f} MiB, splits {sizes}, checksums of {len(checks)} images")


def _render(job: tuple[dict, str, list[tuple[str, str, int]]]) -> int:
    from mule.generators.multi30k_layout import EmbeddedSpec, generate_image
    from mule.generators.scenes import render_scene

    settings, folder, items = job
    spec = EmbeddedSpec(**{k: settings[k] for k in DATA_KEYS})
    for image_id, split, index in items:
        render_scene(generate_image(spec, split, index)[3], spec.image_size).save(
            f"{folder}/{image_id}.jpg", quality=90
        )
    return len(items)


def regenerate(settings: dict, image_ids: list[str], folder: Path) -> dict[str, str]:
    from mule.generators.multi30k_layout import SPLIT_FILES

    prefix = {stem: split for split, (_, stem) in SPLIT_FILES.items()}
    items = []
    for image_id in sorted(set(image_ids) | set(settings["checksums"])):  # the checked ones always
        stem, index = image_id.rsplit("-", 1)
        items.append((image_id, prefix[stem], int(index)))
    folder.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    chunks = [items[i : i + 500] for i in range(0, len(items), 500)]
    with ProcessPoolExecutor(max(1, (os.cpu_count() or 2) - 1)) as pool:
        done = sum(pool.map(_render, [(settings, str(folder), c) for c in chunks]))
    print(f"regenerated {done} images in {time.perf_counter() - started:.0f} s", flush=True)
    for image_id, digest in settings["checksums"].items():
        got = hashlib.sha256((folder / f"{image_id}.jpg").read_bytes()).hexdigest()
        if got != digest:
            raise SystemExit(f"{image_id}: regenerated file differs from the workdir's ({got[:12]} != {digest[:12]})")
    print(f"checksums of {len(settings['checksums'])} sample images match the workdir's files", flush=True)
    return {image_id: str(folder / f"{image_id}.jpg") for image_id in image_ids}


def extract_all(paths: list[str], weights: str, device: torch.device, fp32_images: int,
                overrides: dict) -> tuple[np.ndarray, dict]:  # fmt: skip
    from torch.utils.data import DataLoader

    from mule.mule_core.backbones import extract, extractor_network
    from mule.tasks.shared.extraction import ImageCrops, collate, vectors

    f = replace(resolve("paper", {**overrides, "features.weights": weights}).features, device=str(device))
    net = extractor_network(f, device, None)
    batch = 64

    def loader(subset):
        return DataLoader(ImageCrops(subset, f), batch_size=batch, num_workers=min(14, os.cpu_count() or 1),
                          collate_fn=collate, pin_memory=device.type == "cuda", prefetch_factor=4)  # fmt: skip

    figures = {}
    if fp32_images:  # float32 (no autocast), the network alone on decoded crops, for comparison
        subset = [crops for _, crops, _ in loader(paths[:fp32_images])]
        sync(device)
        started = time.perf_counter()
        with torch.no_grad():
            for crops in subset:
                extract(net, crops.to(device)).float().cpu()
        sync(device)
        figures["fp32_network_images_per_s"] = round(fp32_images / (time.perf_counter() - started), 1)
        started = time.perf_counter()
        for crops in subset:
            vectors(net, crops, device)
        sync(device)
        figures["bf16_network_images_per_s"] = round(fp32_images / (time.perf_counter() - started), 1)
        print(f"network only, {fp32_images} images: {figures}", flush=True)
    out, started, done = [], time.perf_counter(), 0
    for _, crops, _ in loader(paths):  # decoding and cropping in worker processes, as the stage's threads do
        out.append(vectors(net, crops, device))
        done += len(crops)
        if len(out) % 100 == 0:
            print(f"features: {done}/{len(paths)} images, {done / (time.perf_counter() - started):.0f} images/s",
                  flush=True)  # fmt: skip
    seconds = time.perf_counter() - started
    figures |= {"images": len(paths), "seconds": round(seconds, 1), "images_per_s": round(len(paths) / seconds, 1),
                "arch": f.arch, "crops": f.crops, "input_size": f.input_size, "weights": weights}  # fmt: skip
    print(f"features (decode, crops and network, bf16 autocast on CUDA): {figures}", flush=True)
    return np.concatenate(out), figures


def run(inputs: str, weights: str, fp32_images: int, amps: list[bool], out: str | None, subset: int,
        overrides: dict) -> None:  # fmt: skip
    import train_on_workdir

    device = resolve_device("auto")
    name = torch.cuda.get_device_name() if device.type == "cuda" else "CPU"
    print(f"{platform.node()}: {name}, torch {torch.__version__}, {os.cpu_count()} CPUs", flush=True)
    data, splits = train_on_workdir.load_inputs(inputs)
    if subset:
        splits = {name: head(split, subset) for name, split in splits.items()}
    image_ids = sorted({i for split in splits.values() for i in split.image_ids})
    paths = regenerate(data["embedded"], image_ids, Path("/tmp/mule-paper-images"))
    matrix, figures = extract_all([paths[i] for i in image_ids], weights, device, fp32_images, overrides)
    row = {image: i for i, image in enumerate(image_ids)}
    for split in splits.values():
        split.features = torch.from_numpy(matrix[[row[i] for i in split.image_ids]])
    report = {"machine": f"{platform.node()}, {name}", "features": figures, "training": []}
    for amp in amps:
        cfg = resolve("paper", {"data.dataset": "embedded", "train.amp": amp, "train.device": str(device), **overrides})
        started = time.perf_counter()
        result = train_on_workdir.train_variant(f"paper amp={amp}", cfg, data, splits, device, True, True)
        result |= {"amp": amp, "wall_seconds": round(time.perf_counter() - started, 1),
                   "seconds_per_epoch": round(result["seconds"] / cfg.train.epochs, 2)}  # fmt: skip
        report["training"].append(result)
        print(json.dumps(result), flush=True)
    if out:
        Path(out).write_text(json.dumps(report, indent=1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("prepare")
    p.add_argument("--workdir", required=True)
    p.add_argument("--out", required=True)
    r = sub.add_parser("run")
    r.add_argument("--inputs", required=True)
    r.add_argument("--weights", default="random", choices=("random", "imagenet"))
    r.add_argument("--fp32-images", type=int, default=1024)
    r.add_argument("--amp", default="true,false", help="train.amp values to train with, in order")
    r.add_argument("--out")
    r.add_argument("--subset", type=int, default=0, help="the first N images of each split only (a smoke test)")
    r.add_argument("--set", dest="assignments", action="append", default=[], help="config overrides (a smoke test)")
    args = parser.parse_args()
    if args.command == "prepare":
        prepare(args.workdir, args.out)
    else:
        from mule.config.overrides import parse_assignments

        run(args.inputs, args.weights, args.fp32_images, [v == "true" for v in args.amp.split(",")], args.out,
            args.subset, parse_assignments(args.assignments))  # fmt: skip


if __name__ == "__main__":
    main()
