"""Figures people would rather look at than read: training curves, recall bars,
cross-lingual heatmaps, retrieved images."""

from __future__ import annotations

import importlib.util
import warnings
from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from PIL import Image  # noqa: E402

from mule.datasets.image_files import BadImage, load_rgb  # noqa: E402
from mule.experiments.report import RECALL_COLUMNS, RECALL_HEADERS  # noqa: E402

# Japanese and Chinese captions in figure titles need a CJK font after DejaVu Sans: the
# first one matplotlib can find (a system Noto/Source Han/WenQuanYi/IPA font, or the Noto
# Sans CJK SC of the optional `mule[cjk-fonts]` extra). Without one, CJK titles show boxes.
_CJK_FAMILIES = ("Noto Sans CJK SC", "Noto Sans CJK JP", "Source Han Sans SC", "Source Han Sans", "WenQuanYi Zen Hei",
                 "WenQuanYi Micro Hei", "Droid Sans Fallback", "IPAexGothic", "IPAGothic")  # fmt: skip


def _cjk_fallback() -> str | None:
    from matplotlib import font_manager

    # The optional extra ships its fonts as files inside the package (found without
    # importing it: its __init__ needs more than the fonts).
    spec = importlib.util.find_spec("mplfonts")
    for folder in spec.submodule_search_locations if spec and spec.submodule_search_locations else ():
        font = Path(folder) / "fonts" / "NotoSansCJKsc-Regular.otf"
        if font.exists():
            font_manager.fontManager.addfont(str(font))
    available = {f.name for f in font_manager.fontManager.ttflist}
    family = next((f for f in _CJK_FAMILIES if f in available), None)
    if family:
        plt.rcParams["font.family"] = ["DejaVu Sans", family]  # a list: per-glyph fallback
    else:  # boxes instead of glyphs; one warning per character would drown the log
        warnings.filterwarnings("ignore", message=r"Glyph \d+ .* missing from font", category=UserWarning)
    return family


CJK_FONT = _cjk_fallback()


def close(figure) -> None:
    plt.close(figure)


def save(figure, path) -> None:
    """A PNG written atomically (a figure is an output like any other)."""
    from mule.storage.atomic import write_atomic

    write_atomic(path, lambda tmp: figure.savefig(tmp, dpi=110, format="png", pil_kwargs={"compress_level": 1}))


def training_curves(history, title: str, score_label: str):
    epochs = [r.epoch for r in history]
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    keys = [k for k in history[0].losses if k not in ("total", "lc_accuracy")] + ["total"]
    for key in keys:
        left.plot(epochs, [r.losses.get(key, np.nan) for r in history], marker="o", ms=3, label=key)
    left.set(xlabel="epoch", ylabel="loss (weighted)", title="losses")
    left.legend(fontsize=8)
    scores = [r.score for r in history]
    right.plot(epochs, scores, marker="o", color="tab:green", label=score_label)
    validated = any(score is not None for score in scores)
    best = max(range(len(scores)), key=lambda i: scores[i] if scores[i] is not None else -1) if validated else -1
    kept = f"kept: epoch {epochs[best]}" if validated else f"kept: the last, epoch {epochs[best]} (no validation)"
    right.axvline(epochs[best], color="grey", ls="--", lw=1, label=kept)
    if "lc_accuracy" in history[0].losses:
        twin = right.twinx()
        twin.plot(epochs, [r.losses["lc_accuracy"] for r in history], color="tab:red", alpha=0.5, label="LC accuracy")
        twin.set_ylabel("language classifier accuracy", color="tab:red")
        twin.set_ylim(0, 1)
    right.set(xlabel="epoch", ylabel=score_label, title="validation")
    right.legend(fontsize=8, loc="lower right")
    fig.suptitle(title)
    fig.tight_layout()
    return fig


def recall_bars(table: dict[str, dict[str, float]], title: str):
    langs = list(table)
    fig, ax = plt.subplots(figsize=(max(6, 1.8 * len(langs) + 3), 4))
    width = 0.8 / len(RECALL_COLUMNS)
    for i, (column, header) in enumerate(zip(RECALL_COLUMNS, RECALL_HEADERS)):
        values = [table[lang][column] for lang in langs]
        label = header if column.endswith("r1") or column == "mR" else f"{column[:3]} {header}"
        ax.bar(np.arange(len(langs)) + (i - len(RECALL_COLUMNS) / 2 + 0.5) * width, values, width,
               label=label.replace("i2t", "img->txt").replace("t2i", "txt->img"),
               color="black" if column == "mR" else None)  # fmt: skip
    ax.set_xticks(np.arange(len(langs)), langs)
    ax.set(ylabel="recall (%)", title=title, ylim=(0, 100))
    ax.legend(fontsize=7, ncol=4)
    fig.tight_layout()
    return fig


def cross_lingual_heatmap(table: dict[str, dict[str, float]], languages: list[str], title: str, k: int = 1):
    n = len(languages)
    grid = np.full((n, n), np.nan)
    for pair, row in table.items():
        a, b = pair.split("->")
        grid[languages.index(a), languages.index(b)] = row[f"r{k}"]
    fig, ax = plt.subplots(figsize=(1.2 * n + 2, 1.1 * n + 1.5))
    ax.imshow(grid, vmin=0, vmax=100, cmap="viridis")
    for i in range(n):
        for j in range(n):
            if not np.isnan(grid[i, j]):
                ax.text(
                    j, i, f"{grid[i, j]:.1f}", ha="center", va="center", color="white" if grid[i, j] < 60 else "black"
                )
    ax.set_xticks(range(n), languages)
    ax.set_yticks(range(n), languages)
    ax.set(xlabel="target language", ylabel="query language", title=f"{title} (R@{k})")
    fig.tight_layout()
    return fig


# The retrieved-images figure is one picture drawn on one axes: a grid of matplotlib
# axes (one per image, 60 for the demo) took 1.3-1.5 s to draw against about 0.4 s
# (docs/benchmarks-journal.md, 2026-11-26 night).
_TILE, _GAP, _TITLE, _HEADER = 160, 10, 24, 34  # pixels at save()'s 110 dpi
_HIT = np.array([50, 205, 50], dtype=np.uint8)  # limegreen


def retrieved_images(examples: list[dict], top: int = 5):
    """examples: {"lang", "query", "paths": [top image paths], "hits": [bool]}; one row each."""
    row_height = _TITLE + _TILE + _GAP
    width, height = _GAP + top * (_TILE + _GAP), _GAP + len(examples) * row_height
    mosaic = np.full((height, width, 3), 255, dtype=np.uint8)
    labels = []  # (x, y, text) of tiles without a picture
    for row, example in enumerate(examples):
        y = _GAP + row * row_height + _TITLE
        for col, (path, hit) in enumerate(zip(example["paths"][:top], example["hits"][:top])):
            x = _GAP + col * (_TILE + _GAP)
            tile = mosaic[y : y + _TILE, x : x + _TILE]
            problem = _paste(tile, path)
            if problem:
                labels.append((x + _TILE / 2, y + _TILE / 2, problem))
            if hit:
                for edge in (tile[:4], tile[-4:], tile[:, :4], tile[:, -4:]):
                    edge[:] = _HIT
    fig = plt.figure(figsize=(width / 110, (height + _HEADER) / 110))
    ax = fig.add_axes((0, 0, 1, height / (height + _HEADER)))
    ax.imshow(mosaic, interpolation="nearest")
    ax.set_axis_off()
    ax.set(xlim=(0, width), ylim=(height, 0))
    for row, example in enumerate(examples):
        text = example["query"] if len(example["query"]) < 70 else example["query"][:67] + "..."
        ax.text(_GAP, _GAP + row * row_height + _TITLE - 5, f"[{example['lang']}] {text}", fontsize=8, va="bottom")
    for x, y, problem in labels:
        ax.text(x, y, problem, ha="center", va="center")
    fig.suptitle("sentence -> image: top 5 (green = the caption's own image)", fontsize=10, y=1 - 12 / (height + _HEADER),
                 va="top")  # fmt: skip
    return fig


def _paste(tile: np.ndarray, path: str) -> str | None:
    """The image at `path` fitted into `tile` (centred, its aspect kept); else a grey tile
    and why (_unshown)."""
    try:
        with load_rgb(path, min_side=256) as image:
            scale = min(tile.shape[1] / image.width, tile.shape[0] / image.height)
            size = (max(1, round(image.width * scale)), max(1, round(image.height * scale)))
            picture = np.asarray(image.convert("RGB").resize(size, Image.Resampling.BILINEAR))
    except (OSError, BadImage) as error:
        tile[:] = 230
        return _unshown(error)
    h, w = picture.shape[:2]
    top, left = (tile.shape[0] - h) // 2, (tile.shape[1] - w) // 2
    tile[top : top + h, left : left + w] = picture
    return None


def ablation_bars(rows, languages: list[str], title: str):
    """Grouped bars: one group per language, one bar per model (mR); each model its own
    colour (tab20: more rows than the default cycle's ten), chance grey, the legend below
    the bars so that it hides none."""
    fig, ax = plt.subplots(figsize=(max(8, 2.2 * len(languages) + 4), 4.5 + 0.25 * ((len(rows) + 2) // 3)))
    width = 0.8 / max(len(rows), 1)
    colours = plt.get_cmap("tab20").colors
    for i, row in enumerate(rows):
        values = [row.mr.get(lang, np.nan) for lang in languages]
        errors = [row.std.get(lang, 0.0) for lang in languages] if row.std else None
        colour = "0.6" if row.name.startswith("chance") else colours[(2 * i) % 20 + (2 * i) // 20]
        ax.bar(np.arange(len(languages)) + (i - len(rows) / 2 + 0.5) * width, values, width, label=row.name,
               yerr=errors, capsize=2, color=colour)  # fmt: skip
    ax.set_xticks(np.arange(len(languages)), languages)
    ax.set(ylabel="mR (%)", title=title)
    ax.legend(fontsize=7, ncol=3, loc="upper center", bbox_to_anchor=(0.5, -0.08))
    fig.tight_layout()
    return fig


def _show(ax, path: str) -> None:
    ax.axis("off")
    try:
        with load_rgb(path, min_side=256) as image:
            ax.imshow(image)
    except (OSError, BadImage) as error:
        ax.text(0.5, 0.5, _unshown(error), ha="center")


def _unshown(error: Exception) -> str:
    """What a figure says in place of an image it could not load."""
    return "missing" if isinstance(error, FileNotFoundError) else "unreadable"


def search_sheet(found: dict):
    """A contact sheet of `mule search`: the images found for a sentence, or an image and
    the sentences found for it in each language."""
    if "query" in found:
        results = found["results"]
        fig, axes = plt.subplots(1, max(len(results), 1), figsize=(2.3 * max(len(results), 1), 2.9), squeeze=False)
        for ax, result in zip(axes[0], results):
            _show(ax, result["path"])
            ax.set_title(
                f"#{result['rank']} {result['score']:.3f}\n{result['image_id']} ({result['split']})", fontsize=7
            )
        query = found["query"] if len(found["query"]) < 80 else found["query"][:77] + "..."
        fig.suptitle(f"[{found['lang']}] {query}\n{found['model']}", fontsize=9)
    else:
        per_language = found["results"]
        lines = []
        for lang, results in per_language.items():
            lines.append(f"[{lang}]")
            lines += [f"  {r['rank']}. {r['score']:.3f}  {r['text'][:70]}" for r in results]
        height = max(3.0, 0.2 * len(lines) + 0.8)
        fig = plt.figure(figsize=(11, height))
        top = 1 - 0.6 / height  # room for the title
        _show(fig.add_axes((0.01, 0.05, 0.25, top - 0.08)), found["image"])
        text = fig.add_axes((0.28, 0.02, 0.71, top - 0.04))
        text.axis("off")
        text.text(0, 1, "\n".join(lines), va="top", ha="left", fontsize=8, family="sans-serif")
        fig.suptitle(f"{Path(found['image']).name}: nearest sentences ({found['model']})", fontsize=9)
    return fig
