"""What the embedded dataset allows: the recalls of the best possible model, one that
knows every scene and what every caption says, and ranks by Bayes' rule.

A caption's content (its plan: which objects it mentions, in which order, with which of
their attributes, and the background and object count when said) is what a perfect
reader gets from its words. The generator (plans.sample_plan) makes a plan from a scene
with probabilities it knows exactly; `plan_likelihood` computes P(plan | scene) in closed
form (the annotator's habits integrated out). The Bayes-optimal ranking follows:

- sentence -> image: the caption's image is one of the test images, each a priori alike,
  so images rank by P(plan | scene); a one-object scene is far likelier to produce "a red
  circle" than a three-object scene that also holds one;
- image -> sentence: captions rank by the posterior that they describe this image,
  P(plan | scene) / sum over the test scenes of P(plan | scene').

Equal scores are tied (random order), so the recalls are expected values over the tie
order, on the split's actual captions. Captions are rebuilt from (seed, split, index),
exactly as generated. (The previous ceiling treated every image a caption fits as
equally likely; a ranking that preferred scenes with fewer objects beat it.)
"""

from __future__ import annotations

import math
from collections import defaultdict
from itertools import permutations, product

from mule.generators.multi30k_layout import CAPTIONS_PER_IMAGE, TASK1_LANGS, EmbeddedSpec, generate_image
from mule.generators.plans import (
    BACKGROUND_P,
    COLOR_P,
    COUNT_P,
    OBJECT_P,
    PLACE_P,
    SIZE_P,
    CaptionPlan,
)
from mule.generators.scenes import Scene
from mule.mule_core.metrics import expected_hit_rate_ranked


def _fits(mention, obj) -> bool:
    m = mention.obj
    return (m.shape == obj.shape and (not mention.color or m.color == obj.color)
            and (not mention.size or m.size == obj.size) and (not mention.place or m.place == obj.place))  # fmt: skip


def plan_fits(plan: CaptionPlan, scene: Scene) -> bool:
    if plan.background and plan.background != scene.background:
        return False
    if plan.count and plan.count != len(scene.objects):
        return False
    if len(plan.mentions) > len(scene.objects):
        return False
    return any(all(_fits(m, o) for m, o in zip(plan.mentions, chosen))
               for chosen in permutations(scene.objects, len(plan.mentions)))  # fmt: skip


def captions_by_language(spec: EmbeddedSpec, split: str = "test") -> tuple[list[Scene], dict[str, list[tuple]]]:
    """Scenes of a split, and per language its captions' plans with their image, as the
    dataset holds them (en: five; de: five plus the task1 translation; fr, cs: one)."""
    scenes, captions = [], defaultdict(list)
    for index in range(1, spec.sizes()[split] + 1):
        meta, _, _, scene = generate_image(spec, split, index, with_plans=True)
        image = len(scenes)
        scenes.append(scene)
        plans = meta["plans"]
        for lang in ("en", "de"):
            captions[lang] += [(image, p) for p in plans[lang][:CAPTIONS_PER_IMAGE]]
        for lang in TASK1_LANGS[1:]:  # task1 translations of the chosen English plan
            captions[lang].append((image, plans["task1"]))
    return scenes, dict(captions)


class _SceneIndex:
    """Which images have an object fitting a mention: candidates before the exact check.
    Each object fits the 8 mentions of its shape that name any subset of its colour,
    size and place; one pass over the scenes fills them all."""

    def __init__(self, scenes: list[Scene]):
        self.scenes = scenes
        self.with_key: dict[tuple, set[int]] = defaultdict(set)
        for i, scene in enumerate(scenes):
            for o in scene.objects:
                for color, size, place in product((o.color, None), (o.size, None), (o.place, None)):
                    self.with_key[(o.shape, color, size, place)].add(i)

    def with_object(self, mention) -> set[int]:
        m = mention.obj
        return self.with_key.get((m.shape, m.color if mention.color else None, m.size if mention.size else None,
                                  m.place if mention.place else None), set())  # fmt: skip

    def fitting(self, plan: CaptionPlan) -> list[int]:
        candidates = set.intersection(*(self.with_object(m) for m in plan.mentions))
        if len(plan.mentions) == 1 and not plan.background and not plan.count:
            return sorted(candidates)  # the index already found the one object it needs
        return sorted(i for i in candidates if plan_fits(plan, self.scenes[i]))


def _uniform_moment(bounds: tuple[float, float], a: int, b: int) -> float:
    """E[p^a (1 - p)^b] for p uniform on bounds: exact, by expanding (1 - p)^b."""
    low, high = bounds
    total = 0.0
    for j in range(b + 1):
        power = a + j + 1
        total += math.comb(b, j) * (-1) ** j * (high**power - low**power) / power
    return total / (high - low)


def _assignments(plan: CaptionPlan, scene: Scene) -> int:
    """Ordered choices of distinct objects, one per mention, that fit what each says."""
    return sum(all(_fits(m, o) for m, o in zip(plan.mentions, chosen))
               for chosen in permutations(scene.objects, len(plan.mentions)))  # fmt: skip


def plan_likelihood(plan: CaptionPlan, scene: Scene) -> float:
    """P(an annotator of `scene` writes a caption with this content), as plans.sample_plan
    draws it: each object mentioned with probability p_object (or, if none was, one at
    random), in a random order, each attribute named with the annotator's own probability,
    the background and the count sometimes; the habits are uniform on their ranges and
    integrated out. Only what the caption says counts (a mention's unnamed attributes are
    free), so two objects that fit a mention are two ways to write it."""
    n, k = len(scene.objects), len(plan.mentions)
    if k == 0 or k > n:
        return 0.0
    if plan.background is not None and plan.background != scene.background:
        return 0.0
    if plan.count is not None and (n < 2 or plan.count != n):
        return 0.0
    ways = _assignments(plan, scene)
    if not ways:
        return 0.0
    chosen = _uniform_moment(OBJECT_P, k, n - k)  # exactly these k objects were picked...
    if k == 1:
        chosen += _uniform_moment(OBJECT_P, 0, n) / n  # ...or none, then this one at random
    order = 1 / math.factorial(k)
    named = [sum(getattr(m, attr) for m in plan.mentions) for attr in ("color", "size", "place")]
    attributes = math.prod(_uniform_moment(bounds, c, k - c) for bounds, c in zip((COLOR_P, SIZE_P, PLACE_P), named))
    background = BACKGROUND_P if plan.background is not None else 1 - BACKGROUND_P
    count = COUNT_P if plan.count is not None else (1 - COUNT_P if n > 1 else 1.0)
    return ways * chosen * order * attributes * background * count


def _key(value: float) -> float:
    return float(f"{value:.12g}")  # equal scores tie exactly, whatever the float rounding


def bayes_recalls(scenes: list[Scene], items: list[tuple[int, CaptionPlan]], ks=(1, 5, 10),
                  index: _SceneIndex | None = None) -> dict[str, float]:  # fmt: skip
    """Expected R@K both ways of the Bayes-optimal ranking, for captions (owner, plan)."""
    index = index or _SceneIndex(scenes)
    n_images = len(scenes)
    # Per caption: the likelihood of each test scene (those it does not fit: 0).
    likelihoods = []
    for _, plan in items:
        likelihoods.append({i: plan_likelihood(plan, scenes[i]) for i in index.fitting(plan)})
    t2i = {k: 0.0 for k in ks}
    for (owner, _), scores in zip(items, likelihoods):
        groups = _tie_groups(scores.values(), scores[owner], n_images - len(scores))
        for k in ks:
            t2i[k] += expected_hit_rate_ranked(groups, k)
    # Per image: the posterior of every caption that fits it.
    posteriors: dict[int, list[tuple[float, bool]]] = defaultdict(list)
    for (owner, _), scores in zip(items, likelihoods):
        total = sum(scores.values())
        for i, value in scores.items():
            posteriors[i].append((_key(value / total), i == owner))
    i2t = {k: 0.0 for k in ks}
    owners = sorted({owner for owner, _ in items})
    for image in owners:
        by_score: dict[float, list[int]] = defaultdict(lambda: [0, 0])
        for score, own in posteriors[image]:
            by_score[score][0] += 1
            by_score[score][1] += own
        groups = [tuple(by_score[s]) for s in sorted(by_score, reverse=True)]
        for k in ks:
            i2t[k] += expected_hit_rate_ranked(groups, k)
    out = {f"i2t_r{k}": 100 * i2t[k] / len(owners) for k in ks}
    out |= {f"t2i_r{k}": 100 * t2i[k] / len(items) for k in ks}
    out["mR"] = sum(out.values()) / len(out)
    return out


def _tie_groups(values, own: float, unfit: int) -> list[tuple[int, int]]:
    """[(images with this score, 1 if the caption's own image is among them)], best first."""
    counts: dict[float, int] = defaultdict(int)
    for value in values:
        counts[_key(value)] += 1
    own_key = _key(own)
    groups = [(counts[v], int(v == own_key)) for v in sorted(counts, reverse=True)]
    return groups + [(unfit, 0)] if unfit else groups


def ceiling(spec: EmbeddedSpec, split: str = "test") -> dict[str, dict[str, float]]:
    """Per language: the expected R@1/5/10 both ways and mR of the Bayes-optimal model."""
    scenes, captions = captions_by_language(spec, split)
    index = _SceneIndex(scenes)
    return {lang: bayes_recalls(scenes, items, index=index) for lang, items in captions.items()}
