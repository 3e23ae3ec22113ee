"""Training throughput (sentences/s) and evaluation time (1000 images x 5000 sentences).

    python bench/train_throughput.py [--device cpu|cuda] [--steps N] [--presets demo,paper] [--compile]

Synthetic data with Multi30K's shape: 4 languages, 5 captions per image for en/de and 1
for fr/cs, 12-token sentences; the preset's model, losses (NC + LC, hard-negative phase)
and batch size. Nothing is read from disk, so the figures are the model's own speed.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import platform
import time

import numpy as np
import torch

from mule.config.resolution import resolve
from mule.mule_core.encoding import encode_split
from mule.mule_core.metrics import per_language_recalls
from mule.mule_core.model import MuleModel, count_parameters
from mule.mule_core.split_tensors import SplitTensors
from mule.mule_core.training.joint import JointTrainer

LANGS = ["en", "de", "fr", "cs"]
PER_IMAGE = {"en": 5, "de": 5, "fr": 1, "cs": 1}


def pseudo_words(n: int, lang: str, seed: int = 0) -> list[str]:
    """A vocabulary of n made-up words (3 to 10 letters): the subword n-gram tables
    (model.subwords) get a realistic size without a real vocabulary."""
    rng = np.random.default_rng([seed, len(lang)])
    letters = np.array(list("abcdefghijklmnopqrstuvwxyz"))
    return ["<pad>", "<unk>", *("".join(rng.choice(letters, rng.integers(3, 11))) + f"{i}" for i in range(n - 2))]


def synthetic(n_images: int, image_dim: int, vocab: int, tokens: int = 12, seed: int = 0) -> SplitTensors:
    rng = np.random.default_rng(seed)
    image, lang = [], []
    for index, code in enumerate(LANGS):
        image += [i for i in range(n_images) for _ in range(PER_IMAGE[code])]
        lang += [index] * (n_images * PER_IMAGE[code])
    n = len(image)
    lengths = torch.from_numpy(rng.integers(tokens // 2, tokens + 1, n))
    ids = torch.from_numpy(rng.integers(2, vocab, (n, tokens)))
    return SplitTensors(LANGS, ids, lengths, np.array(lang), np.array(image), [str(i) for i in range(n_images)],
                        torch.randn(n_images, image_dim))  # fmt: skip


def bench_training(preset: str, device: torch.device, steps: int, compile_: bool) -> None:
    cfg = resolve(preset)
    image_dim = 512 if preset == "demo" else 2048
    n_images = cfg.train.batch_images * (steps + 2)
    data = synthetic(n_images, image_dim, vocab=20000)
    torch.manual_seed(0)
    model = MuleModel(LANGS, {lang: 20000 for lang in LANGS}, cfg.text.word_dim, image_dim, cfg.model,
                      {lang: pseudo_words(20000, lang) for lang in LANGS})  # fmt: skip
    model.set_image_normalization(data.features)
    train = dataclasses.replace(cfg.train, epochs=1, sentences_per_image={"en": 2, "de": 2, "fr": 1, "cs": 1},
                                compile=compile_, ema=0.0)  # fmt: skip
    trainer = JointTrainer(model, data, cfg.loss, train, device)
    trainer.scheduler.last_epoch = cfg.loss.mining_warmup_steps  # time the hard-negative (top-K) phase
    batches = list(trainer.sampler.batches(1))[: steps + 1]

    def step(batch):
        with torch.autocast("cuda", dtype=torch.float16, enabled=trainer.updates.amp):
            parts = trainer.losses(batch)
            total = sum(v for k, v in parts.items() if k != "lc_accuracy")
        trainer.optimizer.zero_grad(set_to_none=True)
        trainer.updates.scaler.scale(total).backward()
        trainer.updates.scaler.step(trainer.optimizer)
        trainer.updates.scaler.update()

    step(batches[0])  # warm-up (and compilation)
    if device.type == "cuda":
        torch.cuda.synchronize()
    started = time.perf_counter()
    sentences = 0
    for batch in batches[1:]:
        step(batch)
        sentences += len(batch.captions)
    if device.type == "cuda":
        torch.cuda.synchronize()
    seconds = time.perf_counter() - started
    params = count_parameters(model)["total"]
    print(f"train  {preset:<5} batch {cfg.train.batch_images} images ({sentences // len(batches[1:])} sentences), "
          f"{params / 1e6:.1f}M parameters: {sentences / seconds:9.0f} sentences/s, {seconds / len(batches[1:]) * 1000:7.1f} ms/step"
          f"{' (compiled)' if compile_ else ''}")  # fmt: skip


def bench_evaluation(preset: str, device: torch.device) -> None:
    cfg = resolve(preset)
    image_dim = 512 if preset == "demo" else 2048
    data = synthetic(1000, image_dim, vocab=20000)
    keep = data.caption_lang == 0  # the English test set: 1000 images x 5000 sentences
    data = SplitTensors(["en"], data.tokens[keep], data.lengths[keep], data.caption_lang[keep], data.caption_image[keep],
                        data.image_ids, data.features)  # fmt: skip
    model = MuleModel(["en"], {"en": 20000}, cfg.text.word_dim, image_dim, cfg.model, {"en": pseudo_words(20000, "en")})
    model.set_image_normalization(data.features)
    for _ in range(2):  # the second run is the one reported
        if device.type == "cuda":
            torch.cuda.synchronize()
        started = time.perf_counter()
        encoded = encode_split(model, data, device)
        table = per_language_recalls(encoded["image"], encoded["caption_joint"],
                                     torch.from_numpy(data.caption_image).to(device),
                                     torch.from_numpy(data.caption_lang).to(device), ["en"])  # fmt: skip
        seconds = time.perf_counter() - started
    assert table["en"]["sentences"] == 5000
    print(f"eval   {preset:<5} 1000 images x 5000 sentences (encode + R@1/5/10 both ways): {seconds:6.2f} s")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--presets", default="demo,paper")
    parser.add_argument("--compile", action="store_true", help="also time with torch.compile'd losses")
    args = parser.parse_args()
    device = torch.device(args.device)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or platform.machine()
    print(f"machine: {platform.node()}, {os.cpu_count()} CPUs, device {device} ({name}), torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads")  # fmt: skip
    for preset in args.presets.split(","):
        steps = args.steps if preset == "demo" or device.type == "cuda" else max(2, args.steps // 5)
        bench_training(preset, device, steps, False)
        if args.compile:
            bench_training(preset, device, steps, True)
        bench_evaluation(preset, device)


if __name__ == "__main__":
    main()
