"""Writes the COCO-style embedded dataset in the published files' formats.

    annotations/captions_train2014.json, captions_val2014.json   English, 5 per image, every image
    yjcaptions26k_clean.json                  Japanese (YJ format) on train2014 images
    stair_captions_v1.2_val.json              Japanese (STAIR format) on val2014 images
    coco-cn/imageid.human-written-caption.txt Chinese, 1 (sometimes 2) per image, COCO-CN lines
    coco-cn/coco-cn_{train,val,test}.txt      COCO-CN's own split of its images
    images/{train2014,val2014}/COCO_<folder>_<id:012d>.jpg
    dictionaries/en-{ja,zh}.txt               MUSE-format lexicons
    scenes.jsonl, manifest.json (written last)

As in the real data the languages are unbalanced: English on every image, Japanese on
about a fifth, Chinese on about a seventh, and few images in all three (enough for the
val and test splits the reader draws from them, plus 2% of the images). Every caption
is an independent annotation (its own plan) in the language's own grammar.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from mule.generators import lang_en, lang_ja, lang_zh, staging
from mule.generators.plans import sample_plan
from mule.generators.scenes import render_scene, sample_scene
from mule.mule_core.errors import UserError

REALISERS = {"en": lang_en, "ja": lang_ja, "zh": lang_zh}
JA_SHARE, ZH_SHARE, EXTRA_TRILINGUAL_SHARE = 0.20, 0.15, 0.02
CAPTIONS_PER_IMAGE = {"en": 5, "ja": 5}  # zh: COCO-CN has about one human-written caption per image


class EmbeddedSizeError(UserError, ValueError):
    """Sizes (data.*_images) the COCO-style dataset cannot be generated with."""


@dataclass(frozen=True)
class CocoSpec:
    images: int = 5000
    val_images: int = 200  # the reader's split draws val and test from the trilingual images
    test_images: int = 300
    seed: int = 0
    image_size: int = 128

    def language_counts(self) -> dict[str, int]:
        trilingual = self.val_images + self.test_images + round(EXTRA_TRILINGUAL_SHARE * self.images)
        ja = max(round(JA_SHARE * self.images), trilingual)
        zh = max(round(ZH_SHARE * self.images), trilingual)
        if ja + zh - trilingual > self.images:
            raise EmbeddedSizeError(f"{self.images} images cannot hold {ja} Japanese and {zh} Chinese ones")
        return {"trilingual": trilingual, "ja": ja, "zh": zh}


def _languages_per_image(spec: CocoSpec) -> list[set[str]]:
    counts = spec.language_counts()
    order = list(range(spec.images))
    random.Random(f"embedded-coco-languages:{spec.seed}").shuffle(order)
    tri, ja_only, zh_only = (
        counts["trilingual"],
        counts["ja"] - counts["trilingual"],
        counts["zh"] - counts["trilingual"],
    )
    languages = [{"en"} for _ in range(spec.images)]
    for rank, index in enumerate(order):
        if rank < tri:
            languages[index] |= {"ja", "zh"}
        elif rank < tri + ja_only:
            languages[index].add("ja")
        elif rank < tri + ja_only + zh_only:
            languages[index].add("zh")
    return languages


def _coco_json(images: list[dict], annotations: list[dict], description: str) -> dict:
    return {"info": {"description": description, "version": "1.0", "year": 2014}, "licenses": [],
            "images": images, "annotations": annotations}  # fmt: skip


def write_lexicons(directory: Path) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    for lang in ("ja", "zh"):
        target = REALISERS[lang].LEXICON
        pairs = {f"{word.lower()} {translation}" for concept, words in lang_en.LEXICON.items()
                 for word in words for translation in target.get(concept, []) if " " not in word}  # fmt: skip
        (directory / f"en-{lang}.txt").write_text("".join(p + "\n" for p in sorted(pairs)), encoding="utf-8")


def manifest_matches(root: Path, spec: CocoSpec, code: str = "") -> bool:
    return staging.manifest_matches(root, spec, code)


def generate_coco(root: Path, spec: CocoSpec, progress: Callable[[int, int], None] | None = None,
                  code: str = "") -> Path:
    """Writes the dataset under root (into a temporary sibling renamed at the end); reuses
    root when it already holds this spec, written by the same code (`code`:
    datasets.generated.generator_code)."""
    root = Path(root)
    if manifest_matches(root, spec, code):
        return root
    tmp = staging.staging_folder(root)
    for folder in ("annotations", "coco-cn", "images/train2014", "images/val2014"):
        (tmp / folder).mkdir(parents=True)

    ids = sorted(random.Random(f"embedded-coco-ids:{spec.seed}").sample(range(1, 600_000), spec.images))
    languages = _languages_per_image(spec)
    n_train2014 = round(spec.images * 2 / 3)
    coco = {folder: ([], []) for folder in ("train2014", "val2014")}
    japanese = {"yj": ([], []), "stair": ([], [])}
    chinese_lines: list[str] = []
    chinese_images: list[str] = []
    annotation_id = 0
    with open(tmp / "scenes.jsonl", "w", encoding="utf-8") as scenes_file:
        for index, coco_id in enumerate(ids):
            rng = random.Random(f"embedded-coco:{spec.seed}:{index}")
            scene = sample_scene(rng)
            folder = "train2014" if index < n_train2014 else "val2014"
            name = f"COCO_{folder}_{coco_id:012d}"
            render_scene(scene, spec.image_size).save(tmp / "images" / folder / f"{name}.jpg", quality=90)
            image = {"license": 1, "file_name": f"{name}.jpg", "coco_url": "", "height": spec.image_size,
                     "width": spec.image_size, "date_captured": "2013-11-14 16:28:13", "flickr_url": "", "id": coco_id}  # fmt: skip
            captions: dict[str, list[str]] = {}
            for lang in ("en", "ja", "zh"):
                if lang not in languages[index]:
                    continue
                n = CAPTIONS_PER_IMAGE.get(lang) or (2 if rng.random() < 0.2 else 1)
                captions[lang] = [REALISERS[lang].realise(sample_plan(scene, rng), rng) for _ in range(n)]
            for lang, target in (("en", coco[folder]), ("ja", japanese["yj" if folder == "train2014" else "stair"])):
                if lang in captions:
                    target[0].append(image)
                    for text in captions[lang]:
                        annotation_id += 1
                        target[1].append({"image_id": coco_id, "id": annotation_id, "caption": text})
            if "zh" in captions:
                chinese_images.append(name)
                chinese_lines += [f"{name}#{k}\t{text}" for k, text in enumerate(captions["zh"])]
            scenes_file.write(json.dumps({"image": name, "languages": sorted(languages[index]),
                                          "background": scene.background,
                                          "objects": [asdict(o) for o in scene.objects]}, ensure_ascii=False) + "\n")  # fmt: skip
            if progress is not None:
                progress(index + 1, spec.images)

    def dump(path: Path, data: dict) -> None:
        path.write_text(json.dumps(data, ensure_ascii=False), encoding="utf-8")

    for folder, (images, records) in coco.items():
        dump(tmp / "annotations" / f"captions_{folder}.json", _coco_json(images, records, "COCO-style captions"))
    dump(tmp / "yjcaptions26k_clean.json", _coco_json(*japanese["yj"], "YJ Captions 26k-style Japanese captions"))
    dump(tmp / "stair_captions_v1.2_val.json", _coco_json(*japanese["stair"], "STAIR-style Japanese captions"))
    (tmp / "coco-cn" / "imageid.human-written-caption.txt").write_text(
        "\n".join(chinese_lines) + "\n", encoding="utf-8"
    )
    random.Random(f"embedded-coco-cn-split:{spec.seed}").shuffle(chinese_images)
    tenth = max(1, len(chinese_images) // 10)
    for split, names in (("test", chinese_images[:tenth]), ("val", chinese_images[tenth : 2 * tenth]),
                         ("train", chinese_images[2 * tenth :])):  # fmt: skip
        (tmp / "coco-cn" / f"coco-cn_{split}.txt").write_text("".join(n + "\n" for n in sorted(names)))
    write_lexicons(tmp / "dictionaries")
    return staging.publish(tmp, root, spec, code, languages=spec.language_counts())
