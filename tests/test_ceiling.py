"""The embedded dataset's ceiling: expected recalls of a perfect model, checked by hand."""

import pytest

from data_catalog.embedded.ceiling import ceiling, plan_fits
from data_catalog.embedded.multi30k_layout import EmbeddedSpec
from data_catalog.embedded.plans import CaptionPlan, Mention
from data_catalog.embedded.scenes import Scene, SceneObject
from mule_core.metrics import ceiling_recalls, expected_hit_rate, expected_hit_rate_ranked


def test_expected_hit_rate_by_hand():
    assert expected_hit_rate(4, 1, 1) == pytest.approx(1 / 4)  # one right answer among 4 tied
    assert expected_hit_rate(4, 2, 1) == pytest.approx(2 / 4)
    assert expected_hit_rate(4, 2, 2) == pytest.approx(1 - (2 / 4) * (1 / 3))  # both picks wrong: 1/6
    assert expected_hit_rate(3, 1, 5) == 1.0  # everything fits in the top 5


def test_ranked_tie_groups_by_hand():
    # Best group: 2 sentences, none of them the image's; then 3 with one of its own.
    groups = [(2, 0), (3, 1)]
    assert expected_hit_rate_ranked(groups, 1) == 0.0  # the top 1 is from the first group
    assert expected_hit_rate_ranked(groups, 3) == pytest.approx(1 / 3)  # one slot left for 3 tied
    assert expected_hit_rate_ranked(groups, 5) == 1.0
    assert expected_hit_rate_ranked([(1, 1), (10, 0)], 1) == 1.0


def test_ceiling_recalls_by_hand():
    # Image 0 has a unique caption; image 1's caption also fits image 0 (2 images).
    recalls = ceiling_recalls(image_groups=[[(1, 1), (1, 0)], [(1, 1)]], sentence_matches=[1, 2], ks=(1,))
    assert recalls["i2t_r1"] == 100.0  # each image's most specific fitting caption is its own
    assert recalls["t2i_r1"] == pytest.approx(100 * (1 + 1 / 2) / 2)
    assert recalls["mR"] == pytest.approx((100 + 75) / 2)


def obj(shape, color, size="small", place="left"):
    return SceneObject(shape, color, size, place)


def test_a_caption_fits_the_scenes_consistent_with_what_it_says():
    scene = Scene((obj("circle", "red", "large", "left"), obj("star", "blue")), "white", ((0, 0, 1, 0),) * 2, 0)
    red_circle = Mention(obj("circle", "red", "large", "left"), color=True, size=False, place=False)
    assert plan_fits(CaptionPlan((red_circle,), None, None), scene)
    blue_circle = Mention(obj("circle", "blue"), color=True, size=False, place=False)
    assert not plan_fits(CaptionPlan((blue_circle,), None, None), scene)
    a_circle_on_the_right = Mention(obj("circle", "red", "large", "right"), color=False, size=False, place=True)
    assert not plan_fits(CaptionPlan((a_circle_on_the_right,), None, None), scene)
    assert plan_fits(CaptionPlan((red_circle,), "white", 2), scene)
    assert not plan_fits(CaptionPlan((red_circle,), "black", None), scene)  # wrong background
    assert not plan_fits(CaptionPlan((red_circle,), None, 3), scene)  # wrong count
    # Two mentions need two distinct objects: "a circle and a large circle" does not fit one circle.
    any_circle = Mention(obj("circle", "red"), color=False, size=False, place=False)
    assert not plan_fits(CaptionPlan((any_circle, red_circle), None, None), scene)


def test_the_ceiling_of_a_small_embedded_test_set():
    table = ceiling(EmbeddedSpec(train_images=1, val_images=1, test_images=60))
    assert set(table) == {"en", "de", "fr", "cs"}
    for row in table.values():
        assert 0 < row["t2i_r1"] <= row["t2i_r5"] <= row["t2i_r10"] <= 100
        assert 0 < row["i2t_r1"] <= row["i2t_r5"] <= row["i2t_r10"] <= 100
    assert table["fr"] == table["cs"]  # both are translations of the same English plan
