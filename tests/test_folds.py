"""The fold protocol for few photographs (mule_core.folds): a fold's images never reach
training, every image is measured once per seed, and the summary's arithmetic by hand."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from mule.mule_core.folds import FoldRun, cross_validate, fold_of_images, folds, summarize
from mule.mule_core.split_tensors import SplitTensors


def split(images: int) -> SplitTensors:
    """`images` images, each with two English captions and one German; a caption's tokens
    and an image's feature carry the image's number, so a part's content can be traced."""
    caption_image = np.repeat(np.arange(images), 3)
    caption_lang = np.tile([0, 0, 1], images)
    tokens = torch.from_numpy(caption_image + 10)[:, None].repeat(1, 4)
    return SplitTensors(["en", "de"], tokens, torch.full((len(caption_image),), 4), caption_lang, caption_image,
                        [f"photo-{i}" for i in range(images)], torch.arange(images, dtype=torch.float32)[:, None],
                        [f"c{i}" for i in range(len(caption_image))])  # fmt: skip


def traced_images(part: SplitTensors) -> set[int]:
    """The images a part really holds: from its features and from its captions' tokens."""
    from_features = {int(x) for x in part.features[:, 0]}
    from_captions = {int(t) - 10 for t in part.tokens[:, 0]}
    assert from_features == from_captions == {int(i.split("-")[1]) for i in part.image_ids}
    # every caption still points at its own image's row
    assert all(int(part.tokens[c, 0]) - 10 == int(part.features[part.caption_image[c], 0])
               for c in range(len(part.caption_image)))  # fmt: skip
    return from_features


def test_folds_are_balanced_and_the_same_ids_make_the_same_folds_in_any_order():
    ids = [f"photo-{i}" for i in range(23)]
    assignment = fold_of_images(ids, 5, seed=0)
    assert sorted(np.bincount(assignment).tolist()) == [4, 4, 5, 5, 5]
    reordered = fold_of_images(ids[::-1], 5, seed=0)[::-1]
    assert reordered.tolist() == assignment.tolist()
    assert fold_of_images(ids, 5, seed=1).tolist() != assignment.tolist()  # another seed, other folds
    with pytest.raises(ValueError, match="3 images cannot make 5 folds"):
        fold_of_images(ids[:3], 5)


def test_a_folds_photos_never_reach_training_and_every_photo_is_measured_once_per_seed():
    data = split(23)
    trained, measured = [], []

    def fit(train: SplitTensors, seed: int, after_epoch) -> None:
        trained.append((seed, traced_images(train)))
        for _ in range(2):  # two "epochs", each measured
            after_epoch(train)

    def measure(model: SplitTensors, held: SplitTensors) -> dict:
        measured.append(traced_images(held))
        return {"en": {"mR": 10.0}, "de": {"mR": 20.0}}

    runs = cross_validate(data, 5, [0, 1], fit, measure)
    assert [(r.seed, r.fold) for r in runs] == [(s, f) for s in (0, 1) for f in range(5)]
    for index, ((_seed, train_images), run) in enumerate(zip(trained, runs)):
        held_images = measured[2 * index]
        assert measured[2 * index + 1] == held_images  # both epochs measured on the same fold
        assert not train_images & held_images  # the fold's photos never trained on
        assert train_images | held_images == set(range(23))
        assert run.images == len(held_images) and len(run.tables) == 2
        # chance is computed for the held-out fold's own images and captions
        assert run.chance["en"]["sentences"] == 2 * len(held_images)
    for seed in (0, 1):
        folds_of_seed = measured[10 * seed : 10 * seed + 10 : 2]
        assert sorted(i for images in folds_of_seed for i in images) == list(range(23))  # each image once


def test_a_fit_that_measures_nothing_is_an_error_not_a_silent_row():
    with pytest.raises(RuntimeError, match="fold 0, seed 3: fit never called after_epoch"):
        cross_validate(split(10), 2, [3], lambda train, seed, after: None, lambda model, held: {})


def test_the_summary_averages_folds_within_a_seed_then_takes_the_spread_over_seeds_by_hand():
    def run(fold, seed, en, de, chance=5.0):
        table = {"en": {"mR": en}, "de": {"mR": de}}
        return FoldRun(fold, seed, [{"en": {"mR": 0.0}, "de": {"mR": 0.0}}, table],
                       {"en": {"mR": chance}, "de": {"mR": 2 * chance}}, 10)  # fmt: skip

    runs = [run(0, 0, 10, 20), run(1, 0, 30, 40), run(0, 1, 20, 30), run(1, 1, 40, 50, chance=7.0)]
    summary = summarize(runs)
    # seed 0: en (10 + 30) / 2 = 20; seed 1: en 30. Mean 25, std of (20, 30) = 7.07.
    assert summary["en"]["mR"] == 25 and summary["en"]["std"] == pytest.approx(50**0.5)
    assert summary["de"]["mR"] == 35 and summary["en"]["seeds"] == 2
    assert summary["en"]["chance"] == pytest.approx(5.5) and summary["de"]["chance"] == pytest.approx(11.0)
    # the mean over languages per seed: 25 and 35
    assert summary["mean"]["mR"] == 30 and summary["mean"]["by_seed"] == {0: 25, 1: 35}
    assert summarize(runs, epoch=1)["en"]["mR"] == 0.0  # the first epoch's tables


def test_folds_yield_parts_of_the_same_split():
    data = split(12)
    parts = list(folds(data, 3))
    assert [fold for fold, _, _ in parts] == [0, 1, 2]
    assert sum(held.n_images for _, _, held in parts) == 12
    assert all(train.languages == ["en", "de"] and train.caption_ids[0].startswith("c") for _, train, _ in parts)
