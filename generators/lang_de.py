"""German captions: gender, case (nominative, accusative, dative) and mixed declension."""

from __future__ import annotations

import random

from mule.generators.plans import CaptionPlan, Mention, finish, join

# noun, gender
SHAPES = {
    "circle": [("Kreis", "m"), ("Scheibe", "f")],
    "square": [("Quadrat", "n")],
    "triangle": [("Dreieck", "n")],
    "star": [("Stern", "m")],
    "diamond": [("Raute", "f")],
    "hexagon": [("Sechseck", "n")],
    "heart": [("Herz", "n")],
    "cross": [("Kreuz", "n")],
}
# adjective stems that decline regularly
COLORS = {
    "red": ["rot"],
    "green": ["grün"],
    "blue": ["blau"],
    "yellow": ["gelb"],
    "orange": ["orangefarben"],
    "purple": ["violett"],
    "pink": ["rosafarben", "pink"],
    "brown": ["braun"],
    "black": ["schwarz"],
    "white": ["weiß"],
    "gray": ["grau"],
}
SIZES = {"small": ["klein"], "large": ["groß"]}
PLACES = {
    "left": ["links", "auf der linken Seite", "links im Bild"],
    "right": ["rechts", "auf der rechten Seite", "rechts im Bild"],
    "top": ["oben", "im oberen Teil"],
    "bottom": ["unten", "im unteren Teil"],
    "middle": ["in der Mitte", "im Zentrum"],
}
NUMBERS = {2: "zwei", 3: "drei"}

# Indefinite article and adjective ending (mixed declension) by (case, gender).
ARTICLE = {
    ("nom", "m"): "ein", ("nom", "f"): "eine", ("nom", "n"): "ein",
    ("acc", "m"): "einen", ("acc", "f"): "eine", ("acc", "n"): "ein",
    ("dat", "m"): "einem", ("dat", "f"): "einer", ("dat", "n"): "einem",
}  # fmt: skip
ENDING = {
    ("nom", "m"): "er", ("nom", "f"): "e", ("nom", "n"): "es",
    ("acc", "m"): "en", ("acc", "f"): "e", ("acc", "n"): "es",
    ("dat", "m"): "en", ("dat", "f"): "en", ("dat", "n"): "en",
}  # fmt: skip


def noun_phrase(m: Mention, case: str, rng: random.Random, with_place: bool = True) -> str:
    noun, gender = rng.choice(SHAPES[m.obj.shape])
    ending = ENDING[(case, gender)]
    words = [ARTICLE[(case, gender)]]
    if m.size:
        words.append(rng.choice(SIZES[m.obj.size]) + ending)
    if m.color:
        words.append(rng.choice(COLORS[m.obj.color]) + ending)
    words.append(noun)
    if m.place and with_place:
        words.append(rng.choice(PLACES[m.obj.place]))
    return " ".join(words)


def _listed(mentions: tuple[Mention, ...], case: str, rng: random.Random) -> str:
    return join([noun_phrase(m, case, rng) for m in mentions], "und")


def realise(plan: CaptionPlan, rng: random.Random) -> str:
    first = plan.mentions[0]
    plural = len(plan.mentions) > 1
    if plan.count:
        template = rng.choice(["{n} Formen: {b}", "{n} Objekte, darunter {b}"])
        body = template.format(n=NUMBERS[plan.count], b=_listed(plan.mentions, "nom", rng))
    elif first.place and rng.random() < 0.3:
        # Verb second after a fronted place: "Links ist ein roter Kreis und ..."
        verb = rng.choice(["sind", "befinden sich"] if plural else ["ist", "befindet sich"])
        rest = [noun_phrase(m, "nom", rng) for m in plan.mentions[1:]]
        listed = join([noun_phrase(first, "nom", rng, with_place=False)] + rest, "und")
        body = f"{rng.choice(PLACES[first.obj.place])} {verb} {listed}"
    else:
        case, template = rng.choice(
            [
                ("nom", "{}"),
                ("acc", "es gibt {}"),
                ("dat", "ein Bild mit {}"),
                ("dat", "eine Zeichnung mit {}"),
                ("acc", "man sieht {}"),
                ("nom", "zu sehen sind {}" if plural else "zu sehen ist {}"),
            ]
        )
        body = template.format(_listed(plan.mentions, case, rng))
    if plan.background:
        # Strong dative without article: "auf weißem Hintergrund".
        body += " {} {}em Hintergrund".format(rng.choice(["auf", "vor"]), rng.choice(COLORS[plan.background]))
    return finish(body, rng)


LEXICON = {
    **{f"shape:{k}": [n for n, _ in v] for k, v in SHAPES.items()},
    **{f"color:{k}": [s + e for s in v for e in ("", "er", "e", "es", "en", "em")] for k, v in COLORS.items()},
    **{f"size:{k}": [s + e for s in v for e in ("", "er", "e", "es", "en")] for k, v in SIZES.items()},
    "place:left": ["links"], "place:right": ["rechts"], "place:top": ["oben"],
    "place:bottom": ["unten"], "place:middle": ["Mitte", "Zentrum"],
    "word:and": ["und"], "word:background": ["Hintergrund"], "word:picture": ["Bild", "Zeichnung"],
    "word:shapes": ["Formen"], "word:objects": ["Objekte"], "word:two": ["zwei"], "word:three": ["drei"],
}  # fmt: skip
