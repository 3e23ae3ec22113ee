"""Writes the embedded table-layout dataset: what a user with their own photos and a
spreadsheet of captions brings (datasets/readers/table.py reads it).

    captions.csv                  file_name,caption,lang,split: one row per caption (long form)
    photos/<split>/<name>.jpg     the rendered scenes
    dictionaries/en-es.txt        a MUSE-format lexicon (the translate stage's)
    scenes.jsonl, manifest.json   ground truth; the parameters, written last

English and Spanish (a language outside the six of the published datasets), each caption
an independent annotation in its language's grammar; every image and caption is a
function of (seed, split, index), as in the Multi30K-style generator.
"""

from __future__ import annotations

import csv
import json
import random
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

from mule.generators import lang_cs, lang_de, lang_en, lang_es, lang_fr, staging
from mule.generators.multi30k_layout import EmbeddedSpec
from mule.generators.plans import sample_plan
from mule.generators.scenes import render_scene, sample_scene

REALISERS = {"en": lang_en, "de": lang_de, "fr": lang_fr, "cs": lang_cs, "es": lang_es}
LANGUAGES = ("en", "es")
CAPTIONS_PER_IMAGE = 2
TABLE = "captions.csv"


# The same sizes, seed and image size as the Multi30K-style generator's
TableSpec = EmbeddedSpec


def image_captions(spec: TableSpec, split: str, index: int):
    """The scene of one image and its captions per language."""
    rng = random.Random(f"embedded-table:{spec.seed}:{split}:{index}")
    scene = sample_scene(rng)
    captions = {lang: [REALISERS[lang].realise(sample_plan(scene, rng), rng) for _ in range(CAPTIONS_PER_IMAGE)]
                for lang in LANGUAGES}  # fmt: skip
    return scene, captions


def manifest_matches(root: Path, spec: TableSpec, code: str = "") -> bool:
    return staging.manifest_matches(root, spec, code)


def generate_table(root: Path, spec: TableSpec, progress: Callable[[int, int], None] | None = None,
                   code: str = "") -> Path:  # fmt: skip
    """Writes the dataset under root (reused when it holds this spec from this code)."""
    root = Path(root)
    if manifest_matches(root, spec, code):
        return root
    tmp = staging.staging_folder(root)
    tmp.mkdir(parents=True)
    total, done = sum(spec.sizes().values()), 0
    with open(tmp / TABLE, "w", newline="", encoding="utf-8") as table, \
            open(tmp / "scenes.jsonl", "w", encoding="utf-8") as scenes:  # fmt: skip
        writer = csv.writer(table)
        writer.writerow(["file_name", "caption", "lang", "split"])
        for split, n in spec.sizes().items():
            (tmp / "photos" / split).mkdir(parents=True)
            for index in range(1, n + 1):
                scene, captions = image_captions(spec, split, index)
                name = f"photos/{split}/{split}-{index:06d}.jpg"
                render_scene(scene, spec.image_size).save(tmp / name, quality=90)
                for lang in LANGUAGES:
                    for caption in captions[lang]:
                        writer.writerow([name, caption, lang, split])
                scenes.write(json.dumps({"image": name, "split": split, "background": scene.background,
                                         "objects": [asdict(o) for o in scene.objects]}) + "\n")  # fmt: skip
                done += 1
                if progress is not None:
                    progress(done, total)
    _write_lexicons(tmp / "dictionaries")
    return staging.publish(tmp, root, spec, code)


def _write_lexicons(directory: Path) -> None:
    directory.mkdir(parents=True)
    for lang in LANGUAGES[1:]:
        pairs = {f"{word.lower()} {translation.lower()}" for concept, words in lang_en.LEXICON.items()
                 for word in words for translation in REALISERS[lang].LEXICON.get(concept, [])
                 if " " not in word and " " not in translation}  # fmt: skip
        (directory / f"en-{lang}.txt").write_text("".join(p + "\n" for p in sorted(pairs)), encoding="utf-8")
