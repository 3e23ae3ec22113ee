"""Caption plans: what one annotator chose to say about a scene, before any language.

A plan is language-neutral; each language module realises it as a sentence with its
own grammar and word choices. Translations (task1 de/fr/cs) realise the same plan as
the English line, while independent captions (task2) each draw a plan of their own.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from mule.generators.scenes import Scene, SceneObject


@dataclass(frozen=True)
class Mention:
    obj: SceneObject
    color: bool
    size: bool
    place: bool


@dataclass(frozen=True)
class CaptionPlan:
    mentions: tuple[Mention, ...]
    background: str | None  # background colour, when the annotator mentions it
    count: int | None  # number of objects in the scene, when mentioned


# An annotator's habits are drawn uniformly from these ranges (the ceiling integrates them out).
OBJECT_P = (0.55, 1.0)  # how often an object is mentioned
COLOR_P = (0.6, 1.0)  # how often a mentioned object's colour, size, place is named
SIZE_P = (0.15, 0.7)
PLACE_P = (0.15, 0.7)
BACKGROUND_P = 0.25  # the background is named
COUNT_P = 0.2  # the number of objects is named (scenes of two or more)


def sample_plan(scene: Scene, rng: random.Random) -> CaptionPlan:
    """One annotator: own habits (how often they name colour, size, place), own subset."""
    p_object = rng.uniform(*OBJECT_P)
    p_color = rng.uniform(*COLOR_P)
    p_size = rng.uniform(*SIZE_P)
    p_place = rng.uniform(*PLACE_P)
    chosen = [o for o in scene.objects if rng.random() < p_object] or [rng.choice(scene.objects)]
    rng.shuffle(chosen)
    mentions = tuple(
        Mention(o, color=rng.random() < p_color, size=rng.random() < p_size, place=rng.random() < p_place)
        for o in chosen
    )
    background = scene.background if rng.random() < BACKGROUND_P else None
    count = len(scene.objects) if len(scene.objects) > 1 and rng.random() < COUNT_P else None
    return CaptionPlan(mentions, background, count)


def finish(sentence: str, rng: random.Random) -> str:
    """Capitalises and ends a sentence the way annotators do: mostly with a full stop."""
    sentence = sentence[0].upper() + sentence[1:]
    return sentence + "." if rng.random() < 0.85 else sentence


def join(items: list[str], conjunction: str) -> str:
    if len(items) == 1:
        return items[0]
    return ", ".join(items[:-1]) + f" {conjunction} " + items[-1]
