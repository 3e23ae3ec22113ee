"""English captions.

LEXICON maps concepts to single-word forms; it feeds the bilingual dictionaries."""

from __future__ import annotations

import random

from mule.generators.plans import CaptionPlan, Mention, finish, join

SHAPES = {
    "circle": ["circle", "disk"],
    "square": ["square"],
    "triangle": ["triangle"],
    "star": ["star"],
    "diamond": ["diamond", "rhombus"],
    "hexagon": ["hexagon"],
    "heart": ["heart"],
    "cross": ["cross", "plus sign"],
}
COLORS = {
    "red": ["red"],
    "green": ["green"],
    "blue": ["blue"],
    "yellow": ["yellow"],
    "orange": ["orange"],
    "purple": ["purple", "violet"],
    "pink": ["pink"],
    "brown": ["brown"],
    "black": ["black"],
    "white": ["white"],
    "gray": ["gray", "grey"],
}
SIZES = {"small": ["small", "little", "tiny"], "large": ["large", "big"]}
PLACES = {
    "left": ["on the left", "on the left side"],
    "right": ["on the right", "on the right side"],
    "top": ["at the top", "near the top"],
    "bottom": ["at the bottom", "near the bottom"],
    "middle": ["in the middle", "in the center"],
}
NUMBERS = {2: "two", 3: "three"}


def _article(word: str) -> str:
    return "an" if word[0] in "aeiou" else "a"


def noun_phrase(m: Mention, rng: random.Random, with_place: bool = True) -> str:
    words = []
    if m.size:
        words.append(rng.choice(SIZES[m.obj.size]))
    if m.color:
        words.append(rng.choice(COLORS[m.obj.color]))
    words.append(rng.choice(SHAPES[m.obj.shape]))
    phrase = f"{_article(words[0])} {' '.join(words)}"
    if m.place and with_place:
        phrase += " " + rng.choice(PLACES[m.obj.place])
    return phrase


def realise(plan: CaptionPlan, rng: random.Random) -> str:
    first = plan.mentions[0]
    if plan.count:
        listed = join([noun_phrase(m, rng) for m in plan.mentions], "and")
        body = rng.choice(["{n} shapes: {b}", "{n} objects, among them {b}"]).format(n=NUMBERS[plan.count], b=listed)
    elif first.place and rng.random() < 0.3:
        # "On the left there is a red circle and a star."
        rest = [noun_phrase(m, rng) for m in plan.mentions[1:]]
        listed = join([noun_phrase(first, rng, with_place=False)] + rest, "and")
        body = f"{rng.choice(PLACES[first.obj.place])} there is {listed}"
    else:
        listed = join([noun_phrase(m, rng) for m in plan.mentions], "and")
        template = rng.choice(["{}", "there is {}", "a picture of {}", "an image with {}", "we can see {}"])
        body = template.format(listed)
    if plan.background:
        body += rng.choice([" on a {} background", " in front of a {} background"]).format(
            rng.choice(COLORS[plan.background])
        )
    return finish(body, rng)


LEXICON = {
    **{f"shape:{k}": v for k, v in SHAPES.items()},
    **{f"color:{k}": v for k, v in COLORS.items()},
    **{f"size:{k}": v for k, v in SIZES.items()},
    "place:left": ["left"], "place:right": ["right"], "place:top": ["top"],
    "place:bottom": ["bottom"], "place:middle": ["middle", "center"],
    "word:and": ["and"], "word:background": ["background"], "word:picture": ["picture", "image"],
    "word:shapes": ["shapes"], "word:objects": ["objects"], "word:two": ["two"], "word:three": ["three"],
}  # fmt: skip
