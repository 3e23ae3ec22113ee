"""Japanese captions: modifiers before the noun (place + の, size, colour), particles
(が, に, と, の), counters (二つ, 三つ) and verb-final sentences; no spaces between words.

i-adjective colours (赤い) attach directly; noun colours take の (緑の).
"""

from __future__ import annotations

import random

from mule.generators.plans import CaptionPlan, Mention

SHAPES = {
    "circle": ["丸", "円"],
    "square": ["四角", "正方形"],
    "triangle": ["三角", "三角形"],
    "star": ["星"],
    "diamond": ["ひし形"],
    "hexagon": ["六角形"],
    "heart": ["ハート"],
    "cross": ["十字"],
}
# colour -> attributive forms: i-adjectives as they are, nouns with の
COLORS = {
    "red": ["赤い"],
    "green": ["緑の"],
    "blue": ["青い"],
    "yellow": ["黄色い"],
    "orange": ["オレンジの", "オレンジ色の"],
    "purple": ["紫の"],
    "pink": ["ピンクの"],
    "brown": ["茶色の"],
    "black": ["黒い"],
    "white": ["白い"],
    "gray": ["灰色の", "グレーの"],
}
SIZES = {"small": ["小さな", "小さい"], "large": ["大きな", "大きい"]}
PLACES = {
    "left": ["左", "左側"],
    "right": ["右", "右側"],
    "top": ["上", "上の方"],
    "bottom": ["下", "下の方"],
    "middle": ["真ん中", "中央"],
}
COUNTERS = {2: "二つ", 3: "三つ"}  # the native counter つ, for shapes


def noun_phrase(m: Mention, rng: random.Random, with_place: bool = True) -> str:
    words = []
    if m.place and with_place:
        words.append(rng.choice(PLACES[m.obj.place]) + "の")
    if m.size:
        words.append(rng.choice(SIZES[m.obj.size]))
    if m.color:
        words.append(rng.choice(COLORS[m.obj.color]))
    words.append(rng.choice(SHAPES[m.obj.shape]))
    return "".join(words)


def _listed(phrases: list[str]) -> str:
    # AとB; A、BとC
    if len(phrases) == 1:
        return phrases[0]
    return "、".join(phrases[:-1]) + "と" + phrases[-1]


def _background(color: str, rng: random.Random) -> str:
    return rng.choice(COLORS[color]) + "背景に"


def realise(plan: CaptionPlan, rng: random.Random) -> str:
    first = plan.mentions[0]
    prefix = _background(plan.background, rng) if plan.background else ""
    if plan.count:
        listed = _listed([noun_phrase(m, rng) for m in plan.mentions])
        template = rng.choice(["図形が{n}あります：{b}", "{n}の図形：{b}"])
        body = prefix + template.format(n=COUNTERS[plan.count], b=listed)
    elif first.place and rng.random() < 0.3:
        # Place first: 左に赤い丸と星があります
        rest = [noun_phrase(m, rng) for m in plan.mentions[1:]]
        listed = _listed([noun_phrase(first, rng, with_place=False)] + rest)
        body = f"{prefix}{rng.choice(PLACES[first.obj.place])}に{listed}があります"
    else:
        listed = _listed([noun_phrase(m, rng) for m in plan.mentions])
        template = rng.choice(["{}があります", "{}が描かれています", "{}の絵", "{}が見える画像", "{}"])
        body = prefix + template.format(listed)
    return body + "。" if rng.random() < 0.85 else body


def _stem(form: str) -> str:
    return form[:-1] if form.endswith("の") else form


LEXICON = {
    **{f"shape:{k}": v for k, v in SHAPES.items()},
    **{f"color:{k}": [_stem(f) for f in v if f != "オレンジ色の"] for k, v in COLORS.items()},
    **{f"size:{k}": v for k, v in SIZES.items()},
    "place:left": ["左", "左側"], "place:right": ["右", "右側"], "place:top": ["上"],
    "place:bottom": ["下"], "place:middle": ["真ん中", "中央"],
    "word:and": ["と"], "word:background": ["背景"], "word:picture": ["絵", "画像"],
    "word:shapes": ["図形"], "word:two": ["二つ"], "word:three": ["三つ"],
}  # fmt: skip
