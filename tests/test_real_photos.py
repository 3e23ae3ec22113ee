"""Real photographs through the pipeline: a slice of the official Multi30K text (a few
hundred captions in en, de, fr, cs) with its real Flickr photos from ../shared, through
ingest, features, text, train and evaluate; and the image path on these files (photos of
133 to 500 px upscaled to the crop, a progressive JPEG, an EXIF-rotated one). Skips
without ../shared."""

from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from mule.commands.run import photos_for_preset
from mule.config.resolution import resolve
from mule.pipeline.runner import run_alone
from mule.storage.workdir import Workdir

from .conftest import SHARED_MULTI30K, write_gz

PHOTOS = SHARED_MULTI30K.parent / "flickr-photos" / "images"
# (catalog split, task1 stem, task2 stem, photos taken)
SLICE = (("train", "train", "train", 24), ("val", "val", "val", 8), ("test_2016", "test_2016_flickr", "test_2016", 8))
SETTINGS = {"data.dataset": "multi30k", "text.word_dim": 64, "vectors.fasttext_epochs": 2, "vectors.fasttext_buckets": 100_000, "pretrain.enabled": False,
            "train.epochs": 4, "train.batch_images": 8, "loss.mining_warmup_steps": 3, "eval.examples": 0}  # fmt: skip


@pytest.fixture(scope="module")
def photos() -> Path:
    if not (SHARED_MULTI30K / "data").is_dir() or not PHOTOS.is_dir():
        pytest.skip(f"the real Multi30K text and photos are not at {SHARED_MULTI30K} and {PHOTOS}")
    return PHOTOS


def gz_lines(path: Path) -> list[str]:
    with gzip.open(path, "rt", encoding="utf-8") as handle:
        return [line.rstrip("\n") for line in handle]


def real_slice(root: Path, photos: Path) -> dict[str, list[str]]:
    """The official layout, cut to the first photographed images of each split: every file
    keeps its lines for those images, in order. Returns split -> the photos kept."""
    data, kept = SHARED_MULTI30K / "data", {}
    present = {p.name for p in photos.iterdir()}
    for split, stem1, stem2, count in SLICE:
        names = (data / f"task1/image_splits/{stem1}.txt").read_text().split()
        rows = [i for i, name in enumerate(names) if name in present][:count]
        kept[split] = [names[i] for i in rows]
        (root / "data/task1/image_splits").mkdir(parents=True, exist_ok=True)
        (root / f"data/task1/image_splits/{stem1}.txt").write_text("".join(f"{names[i]}\n" for i in rows))
        for lang in ("en", "de", "fr", "cs"):
            lines = gz_lines(data / f"task1/raw/{stem1}.{lang}.gz")
            write_gz(root / f"data/task1/raw/{stem1}.{lang}.gz", [lines[i] for i in rows])
        names2 = (data / f"task2/image_splits/{stem2}_images.txt").read_text().split()
        rows2 = [names2.index(name) for name in kept[split]]
        (root / "data/task2/image_splits").mkdir(parents=True, exist_ok=True)
        (root / f"data/task2/image_splits/{stem2}_images.txt").write_text("".join(f"{n}\n" for n in kept[split]))
        for k in range(1, 6):
            for lang in ("en", "de"):
                lines = gz_lines(data / f"task2/raw/{stem2}.{k}.{lang}.gz")
                write_gz(root / f"data/task2/raw/{stem2}.{k}.{lang}.gz", [lines[i] for i in rows2])
    return kept


def photo_folder(root: Path, photos: Path, names: list[str]) -> dict[str, str]:
    """The slice's photos (links to the real files), two of them rewritten as users' files
    come: a landscape photo as a progressive JPEG, a portrait one stored on its side with
    the EXIF orientation that turns it upright. Returns what was rewritten: kind -> name."""
    root.mkdir()
    sizes = {name: Image.open(photos / name).size for name in names}
    landscape = next(n for n, (w, h) in sizes.items() if w > h and min(w, h) < 224)
    portrait = next(n for n, (w, h) in sizes.items() if h > w)
    for name in names:
        if name not in (landscape, portrait):
            (root / name).symlink_to(photos / name)
    with Image.open(photos / landscape) as image:
        image.save(root / landscape, quality=95, progressive=True)
    with Image.open(photos / portrait) as image:
        exif = Image.Exif()
        exif[0x0112] = 6  # displayed after a quarter turn clockwise
        image.transpose(Image.Transpose.ROTATE_90).save(root / portrait, quality=95, exif=exif)
    return {"progressive": landscape, "exif": portrait}


@pytest.mark.slow
def test_a_slice_of_real_multi30k_with_its_real_photos_runs_from_ingest_to_evaluation(photos, tmp_path, caplog):
    from mule.data_catalog.tables import Catalog
    from mule.mule_core.backbones import CropTransform
    from mule.tasks.shared.extraction import ImageCrops

    kept = real_slice(tmp_path / "multi30k", photos)
    every = [name for names in kept.values() for name in names]
    rewritten = photo_folder(tmp_path / "photos", photos, every)
    assert Image.open(tmp_path / "photos" / rewritten["progressive"]).info.get("progressive")

    # the image path on these files, as the features stage reads them (tasks/shared/extraction)
    cfg = resolve(None, {**SETTINGS, "data.source": str(tmp_path / "multi30k"), "data.images": str(tmp_path / "photos")})
    assert (cfg.preset, cfg.features.crops) == ("few-photos", 10)  # no preset named: sized by its 40 photos
    one = resolve("default", {**SETTINGS, "data.source": str(tmp_path / "multi30k"), "data.images": str(tmp_path / "photos")})
    crops = ImageCrops([str(tmp_path / "photos" / rewritten[k]) for k in ("progressive", "exif")] +
                       [str(photos / rewritten[k]) for k in ("progressive", "exif")], one.features)  # fmt: skip
    progressive, rotated, original_landscape, original_portrait = (crops[i][1] for i in range(4))
    size = one.features.input_size
    assert progressive.shape == rotated.shape == (1, 3, size, size)  # a 133 px side upscaled to the crop
    assert Image.open(photos / rewritten["progressive"]).size[1] < size
    # the same pixels as the original photo, up to the JPEG re-encoding
    assert (progressive.float() - original_landscape.float()).abs().mean() < 3
    assert (rotated.float() - original_portrait.float()).abs().mean() < 3  # EXIF applied: upright again
    sideways = CropTransform(size, 0, 1)(Image.open(tmp_path / "photos" / rewritten["exif"]).convert("RGB"))
    assert (sideways.float() - original_portrait.float()).abs().mean() > 20  # what ignoring EXIF would give

    wd = Workdir.at(tmp_path / "work")
    ingest = run_alone(wd, cfg, "ingest")
    catalog = Catalog(wd)
    counts = {r["split"]: r["n"] for r in catalog.query(
        "SELECT split, count(*) AS n FROM captions WHERE dataset = 'multi30k' GROUP BY split").to_pylist()}  # fmt: skip
    assert 300 < sum(counts.values()) < 700, counts  # a few hundred real captions
    assert ingest["images"] == ingest["images_present"] == len(every)
    # a later run that names no folder keeps the preset: sized by the photos this ingest found
    assert photos_for_preset(wd, {"data.dataset": "multi30k"}) == len(every)
    with caplog.at_level("INFO", logger="mule"):
        one_crop = run_alone(wd, one, "features")
    # a preset named that takes one crop of so few photos is told what the few-photos preset gained
    assert "40 images: with few photos, 10 crops each and 24 joint epochs gained" in caplog.text
    features = run_alone(wd, cfg, "features")
    assert features["images"] == one_crop["images"] == len(every) and not features.get("rejected"), features
    assert features["extractor"] != one_crop["extractor"]  # the ten crops' vectors are their own
    run_alone(wd, cfg, "text")
    with caplog.at_level("WARNING", logger="mule"):
        train = run_alone(wd, cfg, "train")
    assert len(train["history"]) == 4 and np.isfinite(train["val_mean_mR"])
    # the run says that an epoch chosen on 8 photos is noisy, and where settings are judged instead
    assert "validation has 8 images with features (chance mR" in caplog.text and "photo_folds" in caplog.text
    evaluation = run_alone(wd, cfg, "evaluate")
    assert evaluation["images"] == 8 and set(evaluation["table"]) == {"en", "de", "fr", "cs"}
    for lang, row in evaluation["table"].items():
        chance = evaluation["chance"][lang]
        assert row["images"] == chance["images"] == 8 and row["sentences"] == chance["sentences"]
        assert np.isfinite(row["mR"]) and 0 <= row["mR"] <= 100
    # 8 photos with five or six English captions each: chance is far from 0.5
    assert 35 < evaluation["chance"]["en"]["mR"] < 55
