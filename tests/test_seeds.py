"""Figures over seeds (experiments/seeds.py): a difference is a gain only beyond its noise."""

import pytest

from mule.experiments.seeds import mean_spread, paired_difference


def test_mean_and_sample_spread():
    assert mean_spread([58.0, 59.0, 60.0]) == "59.0 ± 1.0"
    assert mean_spread([58.04]) == "58.0"


def test_a_gain_moves_every_seed_the_same_way_by_more_than_the_spread():
    baseline = {0: 50.0, 1: 52.0, 2: 51.0}
    gain = paired_difference({0: 52.0, 1: 53.0, 2: 54.0}, baseline)  # +2, +1, +3
    assert (gain.mean, gain.spread, gain.verdict) == (2.0, 1.0, "gain")
    assert str(gain) == "+2.0 ± 1.0 (gain)"
    loss = paired_difference({0: 49.0, 1: 51.0, 2: 50.0}, baseline)  # -1 on every seed, no spread
    assert (loss.mean, loss.spread, loss.verdict) == (-1.0, 0.0, "loss")


def test_a_difference_inside_the_noise_is_none():
    baseline = {0: 50.0, 1: 52.0, 2: 51.0}
    # +2.5, -0.5, +2.5: the mean (1.5) is below the spread (1.7)
    assert paired_difference({0: 52.5, 1: 51.5, 2: 53.5}, baseline).verdict == "none"
    # +4, +0.5, +0.5: every seed gains, but the mean (1.67) is below the spread (2.02)
    assert paired_difference({0: 54.0, 1: 52.5, 2: 51.5}, baseline).verdict == "none"


def test_only_the_seeds_both_rows_have_are_paired_and_one_seed_has_no_verdict():
    one = paired_difference({0: 53.0, 7: 1.0}, {0: 50.0, 1: 99.0})
    assert (one.mean, one.spread, one.verdict) == (3.0, None, "one seed")
    assert str(one) == "+3.0 (one seed)"
    with pytest.raises(ValueError, match="no seed in common"):
        paired_difference({1: 1.0}, {0: 1.0})
