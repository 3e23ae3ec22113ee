"""A slice of the real Multi30K text with its real photos (../shared/datasets/flickr8k-224)
and xFlickr&CO's real human captions (../shared/datasets/xflickrco): Spanish from its 100
captioned training photos added to a model trained without it, and every language measured
on xFlickr&CO's own test captions of the same photos. Skips without ../shared."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from tests.conftest import SHARED_MULTI30K, write_gz

SHARED = SHARED_MULTI30K.parent
PHOTOS, XFLICKRCO = SHARED / "flickr8k-224" / "images", SHARED / "xflickrco"
# (catalog split, task1 stem, task2 stem)
STEMS = {"train": ("train", "train"), "val": ("val", "val"), "test_2016": ("test_2016_flickr", "test_2016")}


def _lines(path: Path) -> list[str]:
    with gzip.open(path, "rt", encoding="utf-8") as handle:
        return handle.read().splitlines()


def mini_multi30k(out: Path, picked: dict[str, list[str]]) -> Path:
    """A Multi30K checkout holding only the picked images of each split: their lines of every
    task1 and task2 file, in the real files' order."""
    data = SHARED_MULTI30K / "data"
    for split, (stem1, stem2) in STEMS.items():
        names = (data / "task1" / "image_splits" / f"{stem1}.txt").read_text().split()
        wanted = set(picked[split])
        rows = [i for i, name in enumerate(names) if name.removesuffix(".jpg") in wanted]
        (out / "data" / "task1" / "image_splits").mkdir(parents=True, exist_ok=True)
        (out / "data" / "task1" / "image_splits" / f"{stem1}.txt").write_text("".join(names[i] + "\n" for i in rows))
        for lang in ("en", "de", "fr", "cs"):
            lines = _lines(data / "task1" / "raw" / f"{stem1}.{lang}.gz")
            write_gz(out / "data" / "task1" / "raw" / f"{stem1}.{lang}.gz", [lines[i] for i in rows])
        names2 = (data / "task2" / "image_splits" / f"{stem2}_images.txt").read_text().split()
        rows2 = [i for i, name in enumerate(names2) if name.removesuffix(".jpg") in wanted]
        (out / "data" / "task2" / "image_splits").mkdir(parents=True, exist_ok=True)
        (out / "data" / "task2" / "image_splits" / f"{stem2}_images.txt").write_text(
            "".join(names2[i] + "\n" for i in rows2))  # fmt: skip
        for k in range(1, 6):
            for lang in ("en", "de"):
                lines = _lines(data / "task2" / "raw" / f"{stem2}.{k}.{lang}.gz")
                write_gz(out / "data" / "task2" / "raw" / f"{stem2}.{k}.{lang}.gz", [lines[i] for i in rows2])
    return out


def _ids(path: Path) -> list[str]:
    return [json.loads(line)["id"] for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def _photographed(split_file: str, limit: int, among: set[str] | None = None) -> list[str]:
    names = (SHARED_MULTI30K / "data" / "task1" / "image_splits" / split_file).read_text().split()
    ids = [n.removesuffix(".jpg") for n in names if (PHOTOS / n).is_file()]
    return [i for i in ids if among is None or i in among][:limit]


@pytest.mark.slow
def test_spanish_from_100_captions_is_added_and_measured_on_xflickrco_s_human_captions(tmp_path):
    if not (SHARED_MULTI30K / "data").is_dir() or not PHOTOS.is_dir() or not (XFLICKRCO / "es").is_dir():
        pytest.skip(f"the real Multi30K text, flickr8k-224 photos or xFlickr&CO captions are not in {SHARED}")
    from mule.flows.stages import add_language_flow, rebuild_flow

    spanish = _ids(XFLICKRCO / "es" / "train_100.jsonl")
    tested = set(_ids(XFLICKRCO / "es" / "test.jsonl"))
    picked = {"train": spanish + [i for i in _photographed("train.txt", 260) if i not in set(spanish)][:60],
              "val": _photographed("val.txt", 16), "test_2016": _photographed("test_2016_flickr.txt", 30, tested)}  # fmt: skip
    source = mini_multi30k(tmp_path / "multi30k", picked)
    # A fifth of the Spanish training images without their photo (links to the others, not copies)
    photos = tmp_path / "photos"
    photos.mkdir()
    unphotographed = set(spanish[::5])
    for split_ids in picked.values():
        for image in split_ids:
            if image not in unphotographed:
                (photos / f"{image}.jpg").symlink_to(PHOTOS / f"{image}.jpg")
    overrides = {
        "data.dataset": "multi30k-x", "data.format": "multi30k", "data.source": str(source), "data.images": str(photos),
        "data.languages": "en,de,fr,cs,es,id", "data.extra_captions": str(XFLICKRCO),
        "data.extra_files": "es/train_100=train,test=test_xflickrco", "eval.split": "test_xflickrco,test_2016",
        "features.input_size": 64, "vectors.fasttext_epochs": 3, "vectors.fasttext_buckets": 100_000, "text.word_dim": 32,
        "pretrain.epochs": 2, "pretrain.batch_images": 16, "train.epochs": 3, "train.batch_images": 16,
        "eval.examples": 0, "add.words": 2000,
    }  # fmt: skip
    work = tmp_path / "work"
    results = rebuild_flow(workdir=str(work), preset="demo", overrides=overrides,
                           stages=["ingest", "features", "text", "pretrain", "train", "evaluate"])  # fmt: skip
    said = results["ingest"]["extra_captions"]["captions"]
    assert said["es"] == {"train": 100, "test_xflickrco": 30} and said["id"] == {"test_xflickrco": 30}
    assert said["en"] == said["de"] == {"test_xflickrco": 30}  # en/de files named for test only
    assert results["ingest"]["per_split"]["test_2016"]["images"] == 30

    added = add_language_flow(workdir=str(work), preset="demo", overrides={**overrides, "add.languages": "es"})
    rows = added["rows"]
    # LP read every Spanish caption; joint training only the photographed images'
    assert added["images"] == {"joint": 80, "lp": 100}
    assert set(rows["without es"]) == {"en", "de"}  # xFlickr&CO's test has no fr or cs captions (id: not added yet)
    assert set(rows["without es, then es added"]) == {"en", "de", "es"}
    assert rows["without es, then es added"]["en"] == rows["without es"]["en"]  # English untouched, to the digit
    assert added["existing_languages_max_change"] == 0.0
    evaluation = json.loads((work / "results" / "multi30k-x" / "without-es+es" / "evaluation.json").read_text())
    assert evaluation["split"] == "test_xflickrco"
    spanish_row = evaluation["table"]["es"]
    assert spanish_row["images"] == 30 and spanish_row["sentences"] == 30  # one human caption a photo
    assert evaluation["chance"]["es"]["mR"] == pytest.approx(evaluation["chance"]["en"]["mR"])
    assert 0 <= spanish_row["mR"] <= 100
    assert set(evaluation["splits"]["test_2016"]["table"]) == {"en", "de", "fr", "cs"}  # Multi30K's own, as before

    # Indonesian has test captions alone: added with none, read zero-shot from its aligned start
    indonesian = add_language_flow(workdir=str(work), preset="demo",
                                   overrides={**overrides, "add.languages": "id"})  # fmt: skip
    assert indonesian["images"] == {"joint": 0, "lp": 0}
    evaluation = json.loads((work / "results" / "multi30k-x" / "without-id+id" / "evaluation.json").read_text())
    assert evaluation["table"]["id"]["sentences"] == 30 and 0 <= evaluation["table"]["id"]["mR"] <= 100
