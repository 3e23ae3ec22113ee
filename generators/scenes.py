"""Scenes of the embedded dataset: sampled from a seed, rendered with Pillow.

A scene holds 1 to 3 objects, each with a shape, a colour, a size and a place, on a
background. Everything is a pure function of the random generator passed in, so a
seed gives the same images on every machine.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

import numpy as np
from PIL import Image, ImageDraw, ImageFilter

SHAPES = ("circle", "square", "triangle", "star", "diamond", "hexagon", "heart", "cross")
COLORS = {
    "red": (214, 39, 40),
    "green": (44, 160, 44),
    "blue": (31, 84, 200),
    "yellow": (245, 215, 40),
    "orange": (255, 127, 14),
    "purple": (128, 60, 170),
    "pink": (247, 129, 191),
    "brown": (140, 86, 45),
    "black": (20, 20, 20),
    "white": (250, 250, 250),
    "gray": (127, 127, 127),
}
SIZES = ("small", "large")
PLACES = ("left", "right", "top", "bottom", "middle")
# Background name -> (RGB, object colours that would vanish on it).
BACKGROUNDS = {
    "white": ((242, 242, 238), {"white"}),
    "black": ((28, 28, 32), {"black"}),
    "gray": ((160, 160, 160), {"gray"}),
    "blue": ((170, 200, 238), {"blue"}),
    "green": ((178, 222, 168), {"green"}),
    "yellow": ((246, 236, 176), {"yellow"}),
}

_PLACE_CENTER = {
    "left": (0.2, 0.5),
    "right": (0.8, 0.5),
    "top": (0.5, 0.2),
    "bottom": (0.5, 0.8),
    "middle": (0.5, 0.5),
}
_SIZE_RADIUS = {"small": 0.085, "large": 0.15}


@dataclass(frozen=True)
class SceneObject:
    shape: str
    color: str
    size: str
    place: str


@dataclass(frozen=True)
class Scene:
    objects: tuple[SceneObject, ...]
    background: str
    # Rendering jitter, drawn with the scene so a seed fixes the pixels too.
    jitter: tuple[tuple[float, float, float, float], ...]
    noise_seed: int


def sample_scene(rng: random.Random) -> Scene:
    background = rng.choice(tuple(BACKGROUNDS))
    hidden = BACKGROUNDS[background][1]
    n = rng.choices((1, 2, 3), weights=(0.3, 0.4, 0.3))[0]
    places = rng.sample(PLACES, n)
    objects: list[SceneObject] = []
    used: set[tuple[str, str]] = set()
    for place in places:
        while True:  # no two objects share shape and colour, so captions stay unambiguous
            shape = rng.choice(SHAPES)
            color = rng.choice([c for c in COLORS if c not in hidden])
            if (shape, color) not in used:
                break
        used.add((shape, color))
        objects.append(SceneObject(shape, color, rng.choice(SIZES), place))
    jitter = tuple(
        (rng.uniform(-0.04, 0.04), rng.uniform(-0.04, 0.04), rng.uniform(0.9, 1.1), rng.uniform(0, 2 * math.pi))
        for _ in objects
    )
    return Scene(tuple(objects), background, jitter, rng.randrange(2**31))


def _regular_polygon(cx: float, cy: float, r: float, sides: int, phase: float) -> list[tuple[float, float]]:
    return [
        (cx + r * math.cos(phase + 2 * math.pi * k / sides), cy + r * math.sin(phase + 2 * math.pi * k / sides))
        for k in range(sides)
    ]


def _star(cx: float, cy: float, r: float, phase: float) -> list[tuple[float, float]]:
    points = []
    for k in range(10):
        rr = r if k % 2 == 0 else r * 0.45
        a = phase - math.pi / 2 + math.pi * k / 5
        points.append((cx + rr * math.cos(a), cy + rr * math.sin(a)))
    return points


def _draw_object(draw: ImageDraw.ImageDraw, obj: SceneObject, cx: float, cy: float, r: float, tilt: float) -> None:
    fill = COLORS[obj.color]
    small_tilt = (tilt % 1.0 - 0.5) * 0.5  # shapes stay recognisable: at most about 15 degrees
    if obj.shape == "circle":
        draw.ellipse((cx - r, cy - r, cx + r, cy + r), fill=fill)
    elif obj.shape == "square":
        draw.polygon(_regular_polygon(cx, cy, r * 1.2, 4, math.pi / 4 + small_tilt), fill=fill)
    elif obj.shape == "triangle":
        draw.polygon(_regular_polygon(cx, cy + r * 0.15, r * 1.2, 3, -math.pi / 2 + small_tilt), fill=fill)
    elif obj.shape == "star":
        draw.polygon(_star(cx, cy, r * 1.25, small_tilt), fill=fill)
    elif obj.shape == "diamond":
        draw.polygon([(cx, cy - r * 1.25), (cx + r * 0.8, cy), (cx, cy + r * 1.25), (cx - r * 0.8, cy)], fill=fill)
    elif obj.shape == "hexagon":
        draw.polygon(_regular_polygon(cx, cy, r * 1.1, 6, small_tilt), fill=fill)
    elif obj.shape == "heart":
        q = r * 0.55
        draw.ellipse((cx - 2 * q, cy - 1.6 * q, cx, cy + 0.4 * q), fill=fill)
        draw.ellipse((cx, cy - 1.6 * q, cx + 2 * q, cy + 0.4 * q), fill=fill)
        draw.polygon([(cx - 1.95 * q, cy - 0.35 * q), (cx + 1.95 * q, cy - 0.35 * q), (cx, cy + 1.9 * q)], fill=fill)
    elif obj.shape == "cross":
        w = r * 0.38
        draw.rectangle((cx - r, cy - w, cx + r, cy + w), fill=fill)
        draw.rectangle((cx - w, cy - r, cx + w, cy + r), fill=fill)
    else:  # pragma: no cover - SHAPES is closed
        raise ValueError(f"unknown shape {obj.shape!r}")


def render_scene(scene: Scene, size: int = 128) -> Image.Image:
    """Draws the scene at size x size pixels; same scene, same pixels."""
    bg_rgb = BACKGROUNDS[scene.background][0]
    noise_rng = random.Random(scene.noise_seed)
    # A soft vertical gradient and a little grain keep backgrounds from being flat colour.
    shade = noise_rng.uniform(-18, 18)
    t = np.arange(size) / max(size - 1, 1) - 0.5  # one colour a row, as int(c + shade * t) clipped
    rows = np.clip(np.trunc(np.asarray(bg_rgb, dtype=np.float64)[None, :] + shade * t[:, None]), 0, 255).astype(np.uint8)
    image = Image.fromarray(np.ascontiguousarray(np.broadcast_to(rows[:, None, :], (size, size, 3))), "RGB")
    draw = ImageDraw.Draw(image)
    for obj, (dx, dy, scale, tilt) in zip(scene.objects, scene.jitter):
        px, py = _PLACE_CENTER[obj.place]
        _draw_object(draw, obj, (px + dx) * size, (py + dy) * size, _SIZE_RADIUS[obj.size] * scale * size, tilt)
    # Grain from the scene's own generator (Image.effect_noise uses C rand(), not our seed).
    grain = Image.frombytes("L", (size, size), noise_rng.randbytes(size * size)).convert("RGB")
    image = Image.blend(image, grain, noise_rng.uniform(0.03, 0.08))
    return image.filter(ImageFilter.SMOOTH) if size >= 96 else image
