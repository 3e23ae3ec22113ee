"""Feature-extractor throughput: images per second for the demo and the paper settings.

    python bench/features_throughput.py [--images N] [--device cpu|cuda]

Uses random weights (the speed does not depend on the weights) on synthetic images
decoded from JPEG, as the features stage does.
"""

from __future__ import annotations

import argparse
import io
import os
import platform
import time

import torch
from PIL import Image

from mule_core.features import build_resnet, crop_transform, extract

SETTINGS = {
    "demo": ("resnet18", 96, 0, 1),
    "paper": ("resnet152", 448, 512, 10),
}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--images", type=int, default=32)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--batch", type=int, default=16)
    args = parser.parse_args()
    device = torch.device(args.device)
    buffer = io.BytesIO()
    Image.effect_noise((500, 375), 60).convert("RGB").save(buffer, "JPEG")
    jpeg = buffer.getvalue()
    print(f"machine: {platform.node()}, {os.cpu_count()} CPUs, device {device}, torch {torch.__version__}")
    for name, (arch, size, resize, crops) in SETTINGS.items():
        model = build_resnet(arch, None, 0).to(device)
        transform = crop_transform(size, resize, crops)
        n = args.images if name == "demo" else max(4, args.images // 8)
        started = time.perf_counter()
        for begin in range(0, n, args.batch):
            batch = torch.stack([transform(Image.open(io.BytesIO(jpeg))) for _ in range(min(args.batch, n - begin))])
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
                extract(model, batch.to(device))
        if device.type == "cuda":
            torch.cuda.synchronize()
        seconds = time.perf_counter() - started
        print(f"{name:<6} {arch}, {crops} crop(s) of {size}px: {n / seconds:8.1f} images/s ({n} images)")


if __name__ == "__main__":
    main()
