"""Writes the embedded dataset in the official Multi30K repository layout.

    data/task1/image_splits/{train,val,test_2016_flickr}.txt
    data/task1/raw/<split>.{en,de,fr,cs}.gz      one line per image; de/fr/cs translate en
    data/task2/image_splits/{train,val,test_2016}_images.txt
    data/task2/raw/<split>.{1..5}.{en,de}.gz     five independent captions per image
    images/<name>.jpg                            the rendered scenes
    dictionaries/en-{de,fr,cs}.txt               MUSE-format bilingual lexicons
    scenes.jsonl                                 ground truth of every scene (for analysis)
    manifest.json                                the parameters, written last

As in the real data, task1's English line is one of the image's five task2 English
captions, and de/fr/cs of task1 are translations of that line. Every image and caption
is a function of (seed, split, index), so the test set stays the same when the training
set grows.
"""

from __future__ import annotations

import functools
import gzip
import json
import random
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from mule.generators import lang_cs, lang_de, lang_en, lang_fr, staging
from mule.generators.plans import sample_plan
from mule.generators.scenes import Scene, render_scene, sample_scene
from mule.mule_core.devices import process_map

REALISERS = {"en": lang_en, "de": lang_de, "fr": lang_fr, "cs": lang_cs}
TASK1_LANGS = ("en", "de", "fr", "cs")
TASK2_LANGS = ("en", "de")
CAPTIONS_PER_IMAGE = 5
# Our split name -> (task1 file stem, task2 file stem), as in the official repository.
SPLIT_FILES = {"train": ("train", "train"), "val": ("val", "val"), "test": ("test_2016_flickr", "test_2016")}


@dataclass(frozen=True)
class EmbeddedSpec:
    train_images: int = 3000
    val_images: int = 500
    test_images: int = 1000
    seed: int = 0
    image_size: int = 128

    def sizes(self) -> dict[str, int]:
        return {"train": self.train_images, "val": self.val_images, "test": self.test_images}


def image_name(split: str, index: int) -> str:
    return f"{SPLIT_FILES[split][1]}-{index:06d}.jpg"


def _gzip_lines(path: Path, lines: list[str]) -> None:
    # mtime=0: the same dataset gives the same bytes on every run.
    with open(path, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", mtime=0) as gz:
        gz.write("".join(line + "\n" for line in lines).encode("utf-8"))


def _write_lines(path: Path, lines: list[str]) -> None:
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")


def generate_image(
    spec: EmbeddedSpec, split: str, index: int, with_plans: bool = False
) -> tuple[dict, dict[str, list[str]], dict[str, str], Scene]:
    """Scene, task2 captions (5 per language) and task1 lines (en + translations) of one image.
    with_plans: meta also holds the caption plans (the ground truth of what each says)."""
    rng = random.Random(f"embedded-multi30k:{spec.seed}:{split}:{index}")
    scene = sample_scene(rng)
    task2: dict[str, list[str]] = {}
    plans = {}
    for lang in TASK2_LANGS:
        plans[lang] = [sample_plan(scene, rng) for _ in range(CAPTIONS_PER_IMAGE)]
        task2[lang] = [REALISERS[lang].realise(p, rng) for p in plans[lang]]
    # task1: one of the five English lines, translated by a "translator" with own word choices.
    k = rng.randrange(CAPTIONS_PER_IMAGE)
    task1 = {"en": task2["en"][k]}
    for lang in TASK1_LANGS[1:]:
        task1[lang] = REALISERS[lang].realise(plans["en"][k], rng)
    meta = {
        "image": image_name(split, index),
        "split": split,
        "background": scene.background,
        "objects": [asdict(o) for o in scene.objects],
        "task1_en_index": k + 1,
    }
    if with_plans:
        meta["plans"] = {**plans, "task1": plans["en"][k]}
    return meta, task2, task1, scene


def _write_image(spec: EmbeddedSpec, split: str, images: Path, index: int) -> tuple[dict, dict, dict]:
    """Image `index` of `split` rendered into `images`; its (meta, task2, task1)."""
    meta, task2, task1, scene = generate_image(spec, split, index)
    render_scene(scene, spec.image_size).save(images / meta["image"], quality=90)
    return meta, task2, task1


# Below this many images a pool's start (about 0.3 s a process) costs more than it saves.
PARALLEL_FROM = 512


def write_lexicons(directory: Path) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    source = lang_en.LEXICON
    for lang in TASK1_LANGS[1:]:
        target = REALISERS[lang].LEXICON
        pairs = []
        for concept, words in source.items():
            for word in words:
                for translation in target.get(concept, []):
                    if " " not in word and " " not in translation:
                        pairs.append(f"{word.lower()} {translation.lower()}")
        _write_lines(directory / f"en-{lang}.txt", sorted(set(pairs)))


def manifest_matches(root: Path, spec: EmbeddedSpec, code: str = "") -> bool:
    return staging.manifest_matches(root, spec, code)


def generate_multi30k(root: Path, spec: EmbeddedSpec, progress: Callable[[int, int], None] | None = None,
                      code: str = "", processes: int = 1) -> Path:
    """Writes the dataset under root; returns root. Reuses root when it already holds this
    spec, written by the same code (`code`: datasets.generated.generator_code).
    `processes`: how many render the images (the same bytes whatever the count).

    Writes into a sibling temporary folder and renames it at the end, so an interrupted
    run never leaves a half-written dataset behind.
    """
    root = Path(root)
    if manifest_matches(root, spec, code):
        return root
    tmp = staging.staging_folder(root)
    (tmp / "images").mkdir(parents=True)
    for task in ("task1", "task2"):
        (tmp / "data" / task / "image_splits").mkdir(parents=True)
        (tmp / "data" / task / "raw").mkdir(parents=True)

    total = sum(spec.sizes().values())
    with process_map(min(processes, 8) if total >= PARALLEL_FROM else 1, chunksize=64) as mapper:
        _write_splits(tmp, spec, mapper, progress, total)
    write_lexicons(tmp / "dictionaries")
    return staging.publish(tmp, root, spec, code)


def _write_splits(tmp: Path, spec: EmbeddedSpec, mapper: Callable, progress: Callable[[int, int], None] | None,
                  total: int) -> None:  # fmt: skip
    """Every split's images and caption files. Each image is a function of (seed, split,
    index) alone, so `mapper` (map, or a pool's) writes the same bytes in the same order."""
    done = 0
    with open(tmp / "scenes.jsonl", "w", encoding="utf-8") as scenes_file:
        for split, n in spec.sizes().items():
            t1_stem, t2_stem = SPLIT_FILES[split]
            names: list[str] = []
            task1_lines: dict[str, list[str]] = {lang: [] for lang in TASK1_LANGS}
            task2_lines: dict[tuple[int, str], list[str]] = {
                (i, lang): [] for i in range(1, CAPTIONS_PER_IMAGE + 1) for lang in TASK2_LANGS
            }
            for meta, task2, task1 in mapper(functools.partial(_write_image, spec, split, tmp / "images"),
                                             range(1, n + 1)):  # fmt: skip
                names.append(meta["image"])
                scenes_file.write(json.dumps(meta) + "\n")
                for lang in TASK1_LANGS:
                    task1_lines[lang].append(task1[lang])
                for lang in TASK2_LANGS:
                    for i, caption in enumerate(task2[lang], start=1):
                        task2_lines[(i, lang)].append(caption)
                done += 1
                if progress is not None:
                    progress(done, total)
            _write_lines(tmp / "data/task1/image_splits" / f"{t1_stem}.txt", names)
            _write_lines(tmp / "data/task2/image_splits" / f"{t2_stem}_images.txt", names)
            for lang, lines in task1_lines.items():
                _gzip_lines(tmp / "data/task1/raw" / f"{t1_stem}.{lang}.gz", lines)
            for (i, lang), lines in task2_lines.items():
                _gzip_lines(tmp / "data/task2/raw" / f"{t2_stem}.{i}.{lang}.gz", lines)
