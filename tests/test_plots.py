"""The retrieved-images figure, read back from its PNG the way a person looks at it: each
query's top images in a row under the query, the caption's own image framed in green, a
missing file said to be missing."""

import numpy as np
from PIL import Image

from mule.experiments import plots


def test_the_retrieved_images_figure_shows_each_row_under_its_query_and_frames_the_hits(tmp_path):
    colours = {"red": (220, 30, 30), "blue": (30, 60, 220), "yellow": (240, 220, 40)}
    paths = {}
    for name, rgb in colours.items():
        paths[name] = tmp_path / f"{name}.png"
        Image.new("RGB", (128, 96), rgb).save(paths[name])  # not square: fitted with its aspect kept
    examples = [
        {"lang": "en", "query": "a red square", "paths": [str(paths["blue"]), str(paths["red"])], "hits": [False, True]},
        {"lang": "de", "query": "ein gelbes Quadrat", "paths": [str(tmp_path / "gone.png"), str(paths["yellow"])],
         "hits": [False, False]},
    ]
    figure = plots.retrieved_images(examples, top=2)
    plots.save(figure, tmp_path / "retrieved.png")
    plots.close(figure)
    png = np.asarray(Image.open(tmp_path / "retrieved.png").convert("RGB")).astype(int)

    row_height = plots._TITLE + plots._TILE + plots._GAP
    assert png.shape[:2] == (plots._HEADER + plots._GAP + 2 * row_height, plots._GAP + 2 * (plots._TILE + plots._GAP))

    def tile(row: int, col: int) -> np.ndarray:
        y = plots._HEADER + plots._GAP + row * row_height + plots._TITLE
        x = plots._GAP + col * (plots._TILE + plots._GAP)
        return png[y : y + plots._TILE, x : x + plots._TILE]

    def near(pixel, rgb) -> bool:
        return bool(np.abs(np.asarray(pixel) - rgb).max() <= 8)

    middle = plots._TILE // 2
    assert near(tile(0, 0)[middle, middle], colours["blue"]) and near(tile(0, 1)[middle, middle], colours["red"])
    assert near(tile(1, 1)[middle, middle], colours["yellow"])
    assert near(tile(0, 1)[middle, 1], plots._HIT) and near(tile(0, 1)[1, middle], plots._HIT)  # the hit: framed
    assert not near(tile(0, 0)[middle, 1], plots._HIT)  # a miss: not framed
    # 128 x 96 fitted into the square tile: full width, white above and below
    assert near(tile(1, 1)[2, middle], (255, 255, 255)) and near(tile(1, 1)[middle, 2], colours["yellow"])
    missing = tile(1, 0)
    assert near(missing[5, 5], (230, 230, 230))  # grey where the missing image would be ...
    assert (missing.sum(axis=2) < 200).any()  # ... with dark text on it ("missing")
    title_band = png[plots._HEADER + plots._GAP : plots._HEADER + plots._GAP + plots._TITLE]
    assert (title_band.sum(axis=2) < 200).any()  # the first query's line above its row
