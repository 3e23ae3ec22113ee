"""The model library's CUDA paths on a GPU machine that has torch but not the pipeline's
other dependencies (no Prefect, MLflow or DuckDB): the trainer (LP and joint training,
AMP on) and the image extractor (bf16 autocast), with their throughput.

    python bench/cuda_paths.py [--steps 30] [--images 256]

Trains a toy task that can be learned (image i's captions say word i) and checks that
joint training learns it on the GPU as it does on the CPU; runs the paper's extractor
(ResNet-152, 10 crops of 448 px, random weights: speed does not depend on them) and the
demo's (EfficientNet-Lite0, 1 crop of 224 px) over random images through the features
stage's own code (tasks/shared/extraction.py), and prints images/s.
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch
from checkout import use_checkout  # noqa: E402

use_checkout()  # run from anywhere, installed or not

from mule.config.resolution import resolve  # noqa: E402
from mule.mule_core.backbones import extractor_network  # noqa: E402
from mule.mule_core.devices import resolve_device  # noqa: E402
from mule.mule_core.encoding import evaluate_split  # noqa: E402
from mule.mule_core.metrics import mean_mr  # noqa: E402
from mule.mule_core.model import MuleModel  # noqa: E402
from mule.mule_core.split_tensors import SplitTensors  # noqa: E402
from mule.mule_core.training.joint import JointTrainer  # noqa: E402
from mule.mule_core.training.lp import LPTrainer  # noqa: E402

LANGS = ["en", "fr"]


def toy_split(n_images: int, seed: int = 0) -> SplitTensors:
    rows = [(i, 0) for i in range(n_images) for _ in range(2)] + [(i, 1) for i in range(n_images)]
    image, lang = np.array([r[0] for r in rows]), np.array([r[1] for r in rows])
    tokens = torch.tensor([[2 + i, 2 + (i * 7) % n_images] for i in image])
    noise = 0.01 * torch.randn(n_images, n_images, generator=torch.Generator().manual_seed(seed))
    return SplitTensors(LANGS, tokens, torch.full((len(rows),), 2), lang, image,
                        [f"img{i}" for i in range(n_images)], torch.eye(n_images) + noise)  # fmt: skip


def training(device: torch.device, n_images: int, epochs: int) -> None:
    cfg = resolve("demo", {"train.epochs": epochs, "pretrain.epochs": 2, "train.batch_images": 64,
                           "pretrain.batch_images": 64, "loss.mining_warmup_steps": 10,
                           "pretrain.mining_warmup_steps": 10})  # fmt: skip
    data = toy_split(n_images)
    torch.manual_seed(0)
    words = {lang: ["<pad>", "<unk>", *(f"{lang}word{i}" for i in range(n_images))] for lang in LANGS}
    model = MuleModel(LANGS, {lang: n_images + 2 for lang in LANGS}, 64, n_images, cfg.model, words)
    for lang in LANGS:
        model.branches[lang].init_vectors(torch.randn(n_images + 2, 64))
    model.set_image_normalization(data.features)
    before = mean_mr(evaluate_split(model, data, device))
    lp = LPTrainer(model, data, cfg.loss, cfg.train, device, pretrain=cfg.pretrain)
    lp.fit()
    started = time.perf_counter()
    trainer = JointTrainer(model, data, cfg.loss, cfg.train, device)
    history = trainer.fit()
    torch.cuda.synchronize() if device.type == "cuda" else None
    seconds = time.perf_counter() - started
    after = mean_mr(evaluate_split(model, data, device))
    finite = all(np.isfinite(v) for r in history for v in r.losses.values())
    print(f"training on {device} (AMP {trainer.amp}): {n_images} images, {epochs} epochs in {seconds:.1f} s, "
          f"{sum(r.sentences_per_second for r in history) / len(history):.0f} sentences/s; train mR {before:.1f} -> "
          f"{after:.1f}; losses finite: {finite}", flush=True)  # fmt: skip
    if not finite or after < before + 30:
        sys.exit("training did not learn the toy task")


def extraction(device: torch.device, images: int) -> None:
    from PIL import Image

    from mule.tasks.shared.extraction import ImageCrops, collate, vectors

    folder = Path("/tmp/mule-cuda-images")
    folder.mkdir(exist_ok=True)
    paths = []
    for i in range(images):
        path = folder / f"{i}.jpg"
        if not path.exists():
            Image.effect_noise((500, 375), 40 + i % 20).convert("RGB").save(path, quality=90)
        paths.append(str(path))
    for preset, extra, batch in (("paper", {"features.weights": "random"}, 32),
                                 ("demo", {"features.weights": "random"}, 256)):  # fmt: skip
        f = replace(resolve(preset, extra).features, device=str(device))
        net = extractor_network(f, device, None)
        crops = ImageCrops(paths, f)
        batches = [
            collate([crops[i] for i in range(b, min(b + batch, len(paths)))]) for b in range(0, len(paths), batch)
        ]
        vectors(net, batches[0][1], device)  # warm-up
        torch.cuda.synchronize() if device.type == "cuda" else None
        started = time.perf_counter()
        out = [vectors(net, c, device) for _, c, _ in batches]
        torch.cuda.synchronize() if device.type == "cuda" else None
        seconds = time.perf_counter() - started
        matrix = np.concatenate(out)
        print(f"extractor {f.arch}, {f.crops} crop(s) of {f.input_size} px on {device}: {len(paths) / seconds:.1f} "
              f"images/s (network only, decoded crops in memory), vectors {matrix.shape}, finite "
              f"{bool(np.isfinite(matrix).all())}", flush=True)  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="auto")
    parser.add_argument("--images", type=int, default=256)
    parser.add_argument("--toy-images", type=int, default=512)
    parser.add_argument("--epochs", type=int, default=20)
    args = parser.parse_args()
    device = resolve_device(args.device)
    name = torch.cuda.get_device_name() if device.type == "cuda" else "CPU"
    print(f"torch {torch.__version__}, {name}", flush=True)
    training(device, args.toy_images, args.epochs)
    extraction(device, args.images)


if __name__ == "__main__":
    main()
