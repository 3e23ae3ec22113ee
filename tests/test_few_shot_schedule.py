"""A language added from a few-shot set (xFlickr&CO's train_100) trains on the schedules a
full dataset's step-counted settings assume, and chooses its epochs on images it holds out."""

from __future__ import annotations

import numpy as np
import torch

from mule.mule_core.settings import PretrainConfig, TrainConfig
from mule.mule_core.split_tensors import SplitTensors
from mule.stages.extend import FEW_SHOT_STEPS, held_out, stretched


def test_a_hundred_images_are_passed_over_until_each_epoch_has_its_steps():
    train, pretrain = TrainConfig(epochs=16, batch_images=64), PretrainConfig(epochs=10, batch_images=256)
    joint, lp, factor = stretched(train, pretrain, 100)
    # 100 images make 2 joint steps a pass: 13 passes make an epoch of >= 25 steps
    assert factor == 13 and joint.epochs == 16 * 13 and joint.decay_steps == 13 * 2
    assert lp.epochs == 10 * FEW_SHOT_STEPS  # one LP step a pass: 25 passes an epoch
    assert joint.lr == train.lr and joint.batch_images == 64  # nothing else moves


def test_a_language_with_enough_images_keeps_its_schedule():
    train, pretrain = TrainConfig(batch_images=64), PretrainConfig(batch_images=256)
    assert stretched(train, pretrain, 7000) == (train, pretrain, 1)
    assert stretched(train, pretrain, 256 * FEW_SHOT_STEPS)[2] == 1


def test_a_configured_decay_is_kept():
    joint, _, _ = stretched(TrainConfig(batch_images=64, decay_steps=500), PretrainConfig(), 100)
    assert joint.decay_steps == 500


def _split(images: int) -> SplitTensors:
    rows = np.repeat(np.arange(images), 2)  # two captions an image
    return SplitTensors(["en", "es"], torch.zeros(len(rows), 3, dtype=torch.long), torch.ones(len(rows), dtype=torch.long),
                        np.tile([0, 1], images), rows, [f"img{i}" for i in range(images)],
                        torch.arange(images, dtype=torch.float32)[:, None], [f"c{i}" for i in range(len(rows))])  # fmt: skip


def test_a_fifth_of_the_images_is_held_out_with_all_their_captions():
    fitting, held = held_out(_split(100), seed=0)
    assert held is not None and held.n_images == 20 and fitting.n_images == 80
    assert not set(held.image_ids) & set(fitting.image_ids)
    assert len(held.caption_ids) == 40 and sorted(set(held.caption_lang.tolist())) == [0, 1]
    assert held.features[:, 0].tolist() == [float(i.removeprefix("img")) for i in held.image_ids]  # rows follow
    again = held_out(_split(100), seed=0)[1]
    assert again.image_ids == held.image_ids and held_out(_split(100), seed=1)[1].image_ids != held.image_ids


def test_too_few_images_hold_nothing_out():
    data = _split(19)
    fitting, held = held_out(data, seed=0)
    assert fitting is data and held is None
