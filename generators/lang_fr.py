"""French captions: gender agreement, size before and colour after the noun."""

from __future__ import annotations

import random

from mule.generators.plans import CaptionPlan, Mention, finish, join

# noun, gender
SHAPES = {
    "circle": [("cercle", "m"), ("rond", "m"), ("disque", "m")],
    "square": [("carré", "m")],
    "triangle": [("triangle", "m")],
    "star": [("étoile", "f")],
    "diamond": [("losange", "m")],
    "hexagon": [("hexagone", "m")],
    "heart": [("cœur", "m")],
    "cross": [("croix", "f")],
}
# (masculine, feminine)
COLORS = {
    "red": [("rouge", "rouge")],
    "green": [("vert", "verte")],
    "blue": [("bleu", "bleue")],
    "yellow": [("jaune", "jaune")],
    "orange": [("orange", "orange")],
    "purple": [("violet", "violette")],
    "pink": [("rose", "rose")],
    "brown": [("marron", "marron")],
    "black": [("noir", "noire")],
    "white": [("blanc", "blanche")],
    "gray": [("gris", "grise")],
}
SIZES = {"small": [("petit", "petite")], "large": [("grand", "grande"), ("gros", "grosse")]}
PLACES = {
    "left": ["à gauche", "sur la gauche"],
    "right": ["à droite", "sur la droite"],
    "top": ["en haut"],
    "bottom": ["en bas"],
    "middle": ["au milieu", "au centre"],
}
NUMBERS = {2: "deux", 3: "trois"}


def noun_phrase(m: Mention, rng: random.Random, with_place: bool = True) -> str:
    noun, gender = rng.choice(SHAPES[m.obj.shape])
    g = 0 if gender == "m" else 1
    words = ["un" if gender == "m" else "une"]
    if m.size:
        words.append(rng.choice(SIZES[m.obj.size])[g])
    words.append(noun)
    if m.color:
        words.append(rng.choice(COLORS[m.obj.color])[g])
    if m.place and with_place:
        words.append(rng.choice(PLACES[m.obj.place]))
    return " ".join(words)


def realise(plan: CaptionPlan, rng: random.Random) -> str:
    first = plan.mentions[0]
    if plan.count:
        template = rng.choice(["{n} formes : {b}", "{n} objets, dont {b}"])
        body = template.format(n=NUMBERS[plan.count], b=join([noun_phrase(m, rng) for m in plan.mentions], "et"))
    elif first.place and rng.random() < 0.3:
        rest = [noun_phrase(m, rng) for m in plan.mentions[1:]]
        listed = join([noun_phrase(first, rng, with_place=False)] + rest, "et")
        body = f"{rng.choice(PLACES[first.obj.place])}, il y a {listed}"
    else:
        template = rng.choice(["{}", "il y a {}", "une image avec {}", "un dessin avec {}", "on voit {}"])
        body = template.format(join([noun_phrase(m, rng) for m in plan.mentions], "et"))
    if plan.background:
        body += " {} {}".format(rng.choice(["sur un fond", "sur fond"]), rng.choice(COLORS[plan.background])[0])
    return finish(body, rng)


LEXICON = {
    **{f"shape:{k}": [n for n, _ in v] for k, v in SHAPES.items()},
    **{f"color:{k}": sorted({f for pair in v for f in pair}) for k, v in COLORS.items()},
    **{f"size:{k}": sorted({f for pair in v for f in pair}) for k, v in SIZES.items()},
    "place:left": ["gauche"], "place:right": ["droite"], "place:top": ["haut"],
    "place:bottom": ["bas"], "place:middle": ["milieu", "centre"],
    "word:and": ["et"], "word:background": ["fond"], "word:picture": ["image", "dessin"],
    "word:shapes": ["formes"], "word:objects": ["objets"], "word:two": ["deux"], "word:three": ["trois"],
}  # fmt: skip
