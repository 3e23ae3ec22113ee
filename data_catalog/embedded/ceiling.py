"""What the embedded dataset allows: the recalls of a model that knows every scene and
every caption's meaning perfectly, from the generator's ground truth.

A caption fits an image when the image has a distinct object for each object the
caption mentions, with every attribute it names (shape always; colour, size and place
when said), and the background and object count when said. The perfect model knows
these sets and nothing more: for a caption, every fitting image is equally likely (one
tie group, random order); for an image, a fitting caption is its own with probability
1 / (images the caption fits), so specific captions rank above vague ones, ties at
random. The recalls are expected values. Captions are rebuilt from (seed, split,
index), exactly as generated.
"""

from __future__ import annotations

from collections import defaultdict
from itertools import permutations, product

from mule_core.metrics import ceiling_recalls

from .multi30k_layout import CAPTIONS_PER_IMAGE, TASK1_LANGS, EmbeddedSpec, generate_image
from .plans import CaptionPlan
from .scenes import Scene


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


def ceiling(spec: EmbeddedSpec, split: str = "test") -> dict[str, dict[str, float]]:
    """Per language: the expected R@1/5/10 both ways and mR of a perfect model."""
    scenes, captions = captions_by_language(spec, split)
    index = _SceneIndex(scenes)
    table = {}
    for lang, items in captions.items():
        fitting_images = [index.fitting(plan) for _, plan in items]
        # Per image: fitting captions grouped by how many images each fits (fewer: likelier).
        groups: dict[int, dict[int, list[int]]] = defaultdict(lambda: defaultdict(lambda: [0, 0]))
        for (owner, _), images in zip(items, fitting_images):
            for i in images:
                group = groups[i][len(images)]
                group[0] += 1
                group[1] += int(i == owner)
        image_groups = [[tuple(groups[i][n]) for n in sorted(groups[i])] for i in sorted({o for o, _ in items})]
        table[lang] = ceiling_recalls(image_groups, [len(images) for images in fitting_images])
    return table
