"""The embedded dataset's ceiling: the Bayes-optimal model's expected recalls, checked by
hand and against the generator itself on a world small enough to enumerate."""

import math
import random
from collections import Counter, defaultdict

import pytest

from mule.generators.ceiling import bayes_recalls, ceiling, plan_fits, plan_likelihood
from mule.generators.multi30k_layout import EmbeddedSpec
from mule.generators.plans import CaptionPlan, Mention, sample_plan
from mule.generators.scenes import Scene, SceneObject
from mule.mule_core.metrics import ceiling_recalls, expected_hit_rate, expected_hit_rate_ranked


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


WORLD = [  # three scenes that share a red circle on the left
    Scene((obj("circle", "red", "large", "left"),), "white", ((0, 0, 1, 0),), 0),
    Scene((obj("circle", "red", "large", "left"), obj("square", "blue", "small", "right")), "white",
          ((0, 0, 1, 0),) * 2, 0),
    Scene((obj("circle", "red", "small", "top"), obj("circle", "red", "large", "left"), obj("star", "green", "small", "middle")),
          "black", ((0, 0, 1, 0),) * 3, 0),
]  # fmt: skip


def content(plan: CaptionPlan) -> tuple:
    """What a caption says: the mentions in order with their named attributes, background, count."""
    said = tuple((m.obj.shape, m.obj.color if m.color else None, m.obj.size if m.size else None,
                  m.obj.place if m.place else None) for m in plan.mentions)  # fmt: skip
    return said, plan.background, plan.count


@pytest.fixture(scope="module")
def drawn():
    """60,000 captions from the real generator: per content, how often each scene produced it,
    and one plan with that content."""
    counts: dict[tuple, Counter] = defaultdict(Counter)
    example = {}
    rng = random.Random(7)
    for _ in range(20_000):
        for s, scene in enumerate(WORLD):
            plan = sample_plan(scene, rng)
            counts[content(plan)][s] += 1
            example.setdefault(content(plan), plan)
    return counts, example


@pytest.mark.slow
def test_the_likelihood_is_the_generators_own_distribution(drawn):
    """Every caption content the generator drew has the probability the formula gives it:
    no frequent one is off by more than sampling noise (z < 5), and for the one- and
    two-object scenes, whose contents the draw exhausts, the formula puts no mass elsewhere."""
    counts, example = drawn
    n = 20_000
    for s, scene in enumerate(WORLD):
        analytic = {key: plan_likelihood(example[key], scene) for key in counts}
        assert all(analytic[k] > 0 for k in counts if counts[k][s])  # never 0 for what it produced
        frequent = [k for k in counts if analytic[k] * n >= 30]
        z = max(abs(counts[k][s] / n - analytic[k]) / math.sqrt(analytic[k] * (1 - analytic[k]) / n) for k in frequent)
        assert z < 5, (s, z)
        if s < 2:
            assert sum(analytic.values()) == pytest.approx(1.0, abs=1e-3)


def test_no_ranking_from_the_same_information_beats_bayes(drawn):
    """Sentence -> image R@1 over this world (each scene a priori alike): ranking by the
    likelihood is as good as the best ranking chosen per caption content with hindsight
    (up to sampling noise), and clearly better than treating every fitting scene as alike."""
    counts, example = drawn
    total = 3 * 20_000
    best = sum(max(c.values()) for c in counts.values()) / total  # hindsight: the best possible
    bayes = uniform = 0.0
    for key, c in counts.items():
        scores = [plan_likelihood(example[key], scene) for scene in WORLD]
        top = [s for s, v in enumerate(scores) if v == max(scores)]
        fits = [s for s in range(3) if plan_fits(example[key], WORLD[s])]
        bayes += sum(c[s] for s in top) / len(top) / total
        uniform += sum(c[s] for s in fits) / len(fits) / total
    assert bayes > best - 0.005, (bayes, best)
    assert bayes > uniform + 0.1, (bayes, uniform)


def test_bayes_recalls_by_hand():
    """Scene 0 has one red circle, scene 1 a red circle and a square. "A red circle" from each:
    both captions prefer scene 0, so t2i R@1 = 1/2; image 0's best caption is its own or its
    twin (tied: 1/2), image 1 has only its own caption among those that fit it... both fit."""
    circle = Mention(obj("circle", "red"), color=True, size=False, place=False)
    plan = CaptionPlan((circle,), None, None)
    scenes = WORLD[:2]
    recalls = bayes_recalls(scenes, [(0, plan), (1, plan)], ks=(1,))
    assert recalls["t2i_r1"] == 50.0  # both rank scene 0 first; only caption 0 is right
    assert recalls["i2t_r1"] == 50.0  # each image: two identical captions tied, one its own
