"""Spanish captions: gender agreement, colour after the noun, size before or after it.
A language outside the six of the published datasets: the embedded table layout
(table_layout.py) uses it to prove that a new language goes through every stage."""

from __future__ import annotations

import random

from mule.generators.plans import CaptionPlan, Mention, finish, join

# noun, gender
SHAPES = {
    "circle": [("círculo", "m"), ("disco", "m")],
    "square": [("cuadrado", "m")],
    "triangle": [("triángulo", "m")],
    "star": [("estrella", "f")],
    "diamond": [("rombo", "m")],
    "hexagon": [("hexágono", "m")],
    "heart": [("corazón", "m")],
    "cross": [("cruz", "f")],
}
# (masculine, feminine)
COLORS = {
    "red": [("rojo", "roja")],
    "green": [("verde", "verde")],
    "blue": [("azul", "azul")],
    "yellow": [("amarillo", "amarilla")],
    "orange": [("naranja", "naranja")],
    "purple": [("morado", "morada"), ("violeta", "violeta")],
    "pink": [("rosa", "rosa")],
    "brown": [("marrón", "marrón")],
    "black": [("negro", "negra")],
    "white": [("blanco", "blanca")],
    "gray": [("gris", "gris")],
}
SIZES = {"small": [("pequeño", "pequeña")], "large": [("grande", "grande"), ("enorme", "enorme")]}
PLACES = {
    "left": ["a la izquierda"],
    "right": ["a la derecha"],
    "top": ["arriba", "en la parte de arriba"],
    "bottom": ["abajo", "en la parte de abajo"],
    "middle": ["en el medio", "en el centro"],
}
NUMBERS = {2: "dos", 3: "tres"}


def noun_phrase(m: Mention, rng: random.Random, with_place: bool = True) -> str:
    noun, gender = rng.choice(SHAPES[m.obj.shape])
    g = 0 if gender == "m" else 1
    words = ["un" if gender == "m" else "una"]
    size = rng.choice(SIZES[m.obj.size])[g] if m.size else None
    if size and rng.random() < 0.5:  # "un pequeño círculo" or "un círculo pequeño"
        words.append(size)
        size = None
    words.append(noun)
    if m.color:
        words.append(rng.choice(COLORS[m.obj.color])[g])
    if size:
        words.append(size)
    if m.place and with_place:
        words.append(rng.choice(PLACES[m.obj.place]))
    return " ".join(words)


def realise(plan: CaptionPlan, rng: random.Random) -> str:
    first = plan.mentions[0]
    if plan.count:
        template = rng.choice(["{n} formas: {b}", "{n} figuras, entre ellas {b}"])
        body = template.format(n=NUMBERS[plan.count], b=join([noun_phrase(m, rng) for m in plan.mentions], "y"))
    elif first.place and rng.random() < 0.3:
        rest = [noun_phrase(m, rng) for m in plan.mentions[1:]]
        listed = join([noun_phrase(first, rng, with_place=False)] + rest, "y")
        body = f"{rng.choice(PLACES[first.obj.place])} hay {listed}"
    else:
        template = rng.choice(["{}", "hay {}", "una imagen con {}", "un dibujo con {}", "se ve {}"])
        body = template.format(join([noun_phrase(m, rng) for m in plan.mentions], "y"))
    if plan.background:
        body += " {} {}".format(rng.choice(["sobre un fondo", "sobre fondo"]), rng.choice(COLORS[plan.background])[0])
    return finish(body, rng)


LEXICON = {
    **{f"shape:{k}": [n for n, _ in v] for k, v in SHAPES.items()},
    **{f"color:{k}": sorted({f for pair in v for f in pair}) for k, v in COLORS.items()},
    **{f"size:{k}": sorted({f for pair in v for f in pair}) for k, v in SIZES.items()},
    "place:left": ["izquierda"], "place:right": ["derecha"], "place:top": ["arriba"],
    "place:bottom": ["abajo"], "place:middle": ["medio", "centro"],
    "word:and": ["y"], "word:background": ["fondo"], "word:picture": ["imagen", "dibujo"],
    "word:shapes": ["formas"], "word:objects": ["figuras"], "word:two": ["dos"], "word:three": ["tres"],
}  # fmt: skip
