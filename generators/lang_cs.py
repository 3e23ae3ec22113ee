"""Czech captions: gender, nominative / accusative / instrumental, no articles."""

from __future__ import annotations

import random

from mule.generators.plans import CaptionPlan, Mention, finish, join

# (nominative, accusative, instrumental, gender); masculine nouns here are inanimate.
SHAPES = {
    "circle": [("kruh", "kruh", "kruhem", "m"), ("kolečko", "kolečko", "kolečkem", "n")],
    "square": [("čtverec", "čtverec", "čtvercem", "m")],
    "triangle": [("trojúhelník", "trojúhelník", "trojúhelníkem", "m")],
    "star": [("hvězda", "hvězdu", "hvězdou", "f"), ("hvězdička", "hvězdičku", "hvězdičkou", "f")],
    "diamond": [("kosočtverec", "kosočtverec", "kosočtvercem", "m")],
    "hexagon": [("šestiúhelník", "šestiúhelník", "šestiúhelníkem", "m")],
    "heart": [("srdce", "srdce", "srdcem", "n"), ("srdíčko", "srdíčko", "srdíčkem", "n")],
    "cross": [("kříž", "kříž", "křížem", "m"), ("křížek", "křížek", "křížkem", "m")],
}
# Hard-declension adjective stems.
COLORS = {
    "red": ["červen"],
    "green": ["zelen"],
    "blue": ["modr"],
    "yellow": ["žlut"],
    "orange": ["oranžov"],
    "purple": ["fialov"],
    "pink": ["růžov"],
    "brown": ["hněd"],
    "black": ["čern"],
    "white": ["bíl"],
    "gray": ["šed", "šediv"],
}
SIZES = {"small": ["mal"], "large": ["velk"]}
PLACES = {
    "left": ["vlevo", "nalevo"],
    "right": ["vpravo", "napravo"],
    "top": ["nahoře"],
    "bottom": ["dole"],
    "middle": ["uprostřed", "ve středu"],
}
NUMBERS = {2: "dva", 3: "tři"}
_CASE_INDEX = {"nom": 0, "acc": 1, "ins": 2}
ENDING = {
    ("nom", "m"): "ý", ("nom", "f"): "á", ("nom", "n"): "é",
    ("acc", "m"): "ý", ("acc", "f"): "ou", ("acc", "n"): "é",
    ("ins", "m"): "ým", ("ins", "f"): "ou", ("ins", "n"): "ým",
}  # fmt: skip


def noun_phrase(m: Mention, case: str, rng: random.Random, with_place: bool = True) -> str:
    forms = rng.choice(SHAPES[m.obj.shape])
    gender = forms[3]
    ending = ENDING[(case, gender)]
    words = []
    if m.size:
        words.append(rng.choice(SIZES[m.obj.size]) + ending)
    if m.color:
        words.append(rng.choice(COLORS[m.obj.color]) + ending)
    words.append(forms[_CASE_INDEX[case]])
    if m.place and with_place:
        words.append(rng.choice(PLACES[m.obj.place]))
    return " ".join(words)


def with_preposition_s(phrase: str) -> str:
    """'s' becomes 'se' before s, z, š, ž: 'se zeleným kruhem', 's modrou hvězdou'."""
    return ("se " if phrase[0].lower() in "szšž" else "s ") + phrase


def realise(plan: CaptionPlan, rng: random.Random) -> str:
    first = plan.mentions[0]
    plural = len(plan.mentions) > 1

    def listed(case: str) -> str:
        return join([noun_phrase(m, case, rng) for m in plan.mentions], "a")

    if plan.count:
        template = rng.choice(["{n} tvary: {b}", "{n} objekty, mezi nimi {b}"])
        body = template.format(n=NUMBERS[plan.count], b=listed("nom"))
    elif first.place and rng.random() < 0.3:
        rest = [noun_phrase(m, "nom", rng) for m in plan.mentions[1:]]
        items = join([noun_phrase(first, "nom", rng, with_place=False)] + rest, "a")
        body = f"{rng.choice(PLACES[first.obj.place])} {'jsou' if plural else 'je'} {items}"
    else:
        style = rng.randrange(4)
        if style == 0:
            body = listed("nom")
        elif style == 1:
            body = f"na obrázku {'jsou' if plural else 'je'} {listed('nom')}"
        elif style == 2:
            body = "obrázek " + with_preposition_s(listed("ins"))
        else:
            body = "vidíme " + listed("acc")
    if plan.background:
        body += f" na {rng.choice(COLORS[plan.background])}ém pozadí"
    return finish(body, rng)


LEXICON = {
    **{f"shape:{k}": sorted({f for forms in v for f in forms[:3]}) for k, v in SHAPES.items()},
    **{f"color:{k}": [s + e for s in v for e in ("ý", "á", "é", "ou", "ým", "ém")] for k, v in COLORS.items()},
    **{f"size:{k}": [s + e for s in v for e in ("ý", "á", "é", "ou", "ým")] for k, v in SIZES.items()},
    "place:left": ["vlevo", "nalevo"], "place:right": ["vpravo", "napravo"], "place:top": ["nahoře"],
    "place:bottom": ["dole"], "place:middle": ["uprostřed", "středu"],
    "word:and": ["a"], "word:background": ["pozadí"], "word:picture": ["obrázek"],
    "word:shapes": ["tvary"], "word:objects": ["objekty"], "word:two": ["dva"], "word:three": ["tři"],
}  # fmt: skip
