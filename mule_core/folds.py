"""K folds over a split's images, for judging settings when there are few photographs.

Each image belongs to one fold, drawn from a hash of its id and the seed (the same ids
make the same folds in whatever order they come; folds differ in size by at most one). Fold f's
model trains on the other folds' images and every caption of theirs, and is measured on
fold f's images alone: a fold's photos are never trained on. Settings are compared on the
mean over folds (and seeds); the dataset's test split is read once, after.
"""

from __future__ import annotations

import hashlib
import statistics
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from mule.mule_core.metrics import chance_table
from mule.mule_core.split_tensors import SplitTensors


def fold_of_images(image_ids: Sequence[str], k: int, seed: int = 0) -> np.ndarray:
    """The fold (0..k-1) of each image: images ordered by a seeded hash of their id, then
    dealt round-robin."""
    if k < 2:
        raise ValueError(f"folds need k >= 2, got {k}")
    if len(image_ids) < k:
        raise ValueError(f"{len(image_ids)} images cannot make {k} folds")
    digest = [hashlib.sha256(f"{seed}:{image}".encode()).hexdigest() for image in image_ids]
    order = sorted(range(len(image_ids)), key=digest.__getitem__)
    folds = np.empty(len(image_ids), dtype=np.int64)
    folds[order] = np.arange(len(image_ids)) % k
    return folds


def folds(data: SplitTensors, k: int, seed: int = 0) -> Iterator[tuple[int, SplitTensors, SplitTensors]]:
    """(fold, training part, held-out fold) for each of k folds over data's images."""
    assignment = fold_of_images(data.image_ids, k, seed)
    for fold in range(k):
        held = assignment == fold
        yield fold, data.only_images(~held), data.only_images(held)


Table = dict[str, dict[str, float]]  # language -> {i2t_r1, ..., mR, images, sentences}


@dataclass
class FoldRun:
    """One model of the protocol: its fold, its seed, its held-out fold's recall table after
    each epoch (one table for a model fitted in one go) and chance on that fold."""

    fold: int
    seed: int
    tables: list[Table]
    chance: Table
    images: int


def cross_validate(
    data: SplitTensors,
    k: int,
    seeds: Sequence[int],
    fit: Callable[[SplitTensors, int, Callable[[Any], None]], Any],
    measure: Callable[[Any, SplitTensors], Table],
    fold_seed: int = 0,
) -> list[FoldRun]:
    """For each seed and fold: fit(training part, seed, after_epoch) trains on the training
    part alone and calls after_epoch(model) after every epoch (once, for a model fitted in
    one go); each call measures the model on the held-out fold (measure(model, fold)). The
    held-out fold never reaches fit: what fit is given is all it can train on."""
    runs = []
    for seed in seeds:
        for fold, train, held in folds(data, k, fold_seed):
            tables: list[Table] = []
            fit(train, seed, lambda model, held=held, tables=tables: tables.append(measure(model, held)))
            if not tables:
                raise RuntimeError(f"fold {fold}, seed {seed}: fit never called after_epoch, so nothing was measured")
            chance = chance_table(torch.from_numpy(held.caption_image), torch.from_numpy(held.caption_lang),
                                  held.languages)  # fmt: skip
            runs.append(FoldRun(fold, seed, tables, chance, held.n_images))
    return runs


def summarize(runs: list[FoldRun], epoch: int | None = None) -> dict[str, dict[str, float]]:
    """Per language: the mR at `epoch` (1-based; None: each run's last) averaged over the
    folds of a seed, then mean and standard deviation over seeds; chance averaged over the
    folds. Also "mean" (over languages, the same way)."""
    by_seed: dict[int, dict[str, list[float]]] = {}
    chance: dict[str, list[float]] = {}
    for run in runs:
        table = run.tables[-1] if epoch is None else run.tables[epoch - 1]
        for lang, row in table.items():
            by_seed.setdefault(run.seed, {}).setdefault(lang, []).append(row["mR"])
            chance.setdefault(lang, []).append(run.chance[lang]["mR"])
    per_seed = {seed: {lang: statistics.fmean(v) for lang, v in langs.items()} for seed, langs in by_seed.items()}
    out = {}
    for lang in chance:
        values = [langs[lang] for langs in per_seed.values() if lang in langs]
        out[lang] = _spread(values) | {"chance": statistics.fmean(chance[lang])}
    means = [statistics.fmean(langs.values()) for langs in per_seed.values()]
    out["mean"] = _spread(means) | {"chance": statistics.fmean(out[lang]["chance"] for lang in chance)}
    out["mean"]["by_seed"] = dict(zip(per_seed, means))
    return out


def _spread(values: list[float]) -> dict[str, float]:
    return {"mR": statistics.fmean(values), "std": statistics.stdev(values) if len(values) > 1 else 0.0,
            "seeds": len(values)}  # fmt: skip
