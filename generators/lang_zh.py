"""Chinese captions: numeral + measure word before the noun (一个, 一颗, 两个), colour
with 的, existential 有 after a fronted place (左边有…), 和 and 、 in lists; no spaces.
"""

from __future__ import annotations

import random

from mule.generators.plans import CaptionPlan, Mention

# shape -> (noun, measure word)
SHAPES = {
    "circle": [("圆形", "个"), ("圆", "个")],
    "square": [("正方形", "个"), ("方块", "个")],
    "triangle": [("三角形", "个")],
    "star": [("星星", "颗"), ("五角星", "个")],
    "diamond": [("菱形", "个")],
    "hexagon": [("六边形", "个")],
    "heart": [("心形", "个"), ("爱心", "颗")],
    "cross": [("十字", "个")],
}
COLORS = {
    "red": ["红色"],
    "green": ["绿色"],
    "blue": ["蓝色"],
    "yellow": ["黄色"],
    "orange": ["橙色", "橘色"],
    "purple": ["紫色"],
    "pink": ["粉色", "粉红色"],
    "brown": ["棕色", "咖啡色"],
    "black": ["黑色"],
    "white": ["白色"],
    "gray": ["灰色"],
}
SIZES = {"small": ["小"], "large": ["大"]}
PLACES = {
    "left": ["左边", "左侧"],
    "right": ["右边", "右侧"],
    "top": ["上方", "上面"],
    "bottom": ["下方", "下面"],
    "middle": ["中间", "中央"],
}
NUMBERS = {2: "两", 3: "三"}  # 两, not 二, before a measure word


def noun_phrase(m: Mention, rng: random.Random, with_place: bool = True) -> str:
    noun, measure = rng.choice(SHAPES[m.obj.shape])
    colour = rng.choice(COLORS[m.obj.color]) + "的" if m.color else ""
    size = rng.choice(SIZES[m.obj.size]) if m.size else ""
    if m.place and with_place:
        # 左边的红色小圆形: the place takes 的 and replaces the numeral
        return rng.choice(PLACES[m.obj.place]) + "的" + colour.removesuffix("的") + size + noun
    return "一" + measure + colour + size + noun


def _listed(phrases: list[str]) -> str:
    if len(phrases) == 1:
        return phrases[0]
    return "、".join(phrases[:-1]) + "和" + phrases[-1]


def realise(plan: CaptionPlan, rng: random.Random) -> str:
    first = plan.mentions[0]
    if plan.count:
        listed = _listed([noun_phrase(m, rng) for m in plan.mentions])
        template = rng.choice(["{n}个图形：{b}", "共有{n}个图形，包括{b}"])
        body = template.format(n=NUMBERS[plan.count], b=listed)
    elif first.place and rng.random() < 0.3:
        rest = [noun_phrase(m, rng) for m in plan.mentions[1:]]
        listed = _listed([noun_phrase(first, rng, with_place=False)] + rest)
        body = f"{rng.choice(PLACES[first.obj.place])}有{listed}"
    else:
        listed = _listed([noun_phrase(m, rng) for m in plan.mentions])
        template = rng.choice(["图中有{}", "画面里有{}", "一张有{}的图片", "{}"])
        body = template.format(listed)
    if plan.background:
        body += "，背景是" + rng.choice(COLORS[plan.background]) + "的"
    return body + "。" if rng.random() < 0.85 else body


LEXICON = {
    **{f"shape:{k}": [n for n, _ in v] for k, v in SHAPES.items()},
    **{f"color:{k}": v for k, v in COLORS.items()},
    **{f"size:{k}": v for k, v in SIZES.items()},
    "place:left": ["左边", "左侧"], "place:right": ["右边", "右侧"], "place:top": ["上方", "上面"],
    "place:bottom": ["下方", "下面"], "place:middle": ["中间", "中央"],
    "word:and": ["和"], "word:background": ["背景"], "word:picture": ["图片"],
    "word:shapes": ["图形"], "word:two": ["两个"], "word:three": ["三个"],
}  # fmt: skip
