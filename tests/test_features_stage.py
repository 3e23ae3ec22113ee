"""The features stage: bad image files become rejects and the stage completes; training
leaves those images out and says so; a Dask cluster gives the same table."""

import logging
import shutil

import numpy as np
import pyarrow.parquet as pq
import pytest
from PIL import Image

from mule.config.resolution import resolve
from mule.data_catalog.tables import Catalog
from mule.experiments.relocation import adopt
from mule.pipeline.runner import run_alone
from mule.storage.workdir import Workdir
from mule.tasks.shared.preparation import write_generated
from tests.test_image_kinds import png_claiming_size

pytestmark = pytest.mark.slow  # the whole file: it shares one fixture of tens of seconds, or runs real processes

TINY = {"data.train_images": 24, "data.val_images": 8, "data.test_images": 8, "data.image_size": 48,
        "features.input_size": 32, "features.shard_images": 8, "vectors.fasttext_epochs": 2, "vectors.fasttext_buckets": 100_000, "text.word_dim": 64}  # fmt: skip


def ingested(root, overrides: dict) -> tuple[Workdir, object]:
    cfg = resolve("demo", overrides)
    wd = Workdir.at(root)
    run_alone(wd, cfg, "ingest")  # generates the dataset first
    return wd, cfg


def image_path(wd: Workdir, image_id: str):
    return wd.raw_dir("embedded") / "images" / image_id


def test_bad_images_become_rejects_and_the_stage_completes(tmp_path, caplog):
    root = tmp_path / "work"
    cfg = resolve("demo", TINY)
    wd = Workdir.at(root)
    write_generated(wd, cfg)
    images = sorted(p.name for p in (wd.raw_dir("embedded") / "images").iterdir())
    train_images = [name for name in images if name.startswith("train-")]
    bad = train_images[:6]  # training images, to see them left out
    gone_before_ingest, bomb = bad[0], bad[5]
    image_path(wd, gone_before_ingest).unlink()
    # Hostile files already there at ingest, which opens every image for its size: a PNG of
    # a few bytes that claims 10^10 pixels; and odd but valid ones (16-bit grey, CMYK).
    image_path(wd, bomb).write_bytes(png_claiming_size(100_000, 100_000))
    odd = train_images[6:8]
    Image.fromarray((np.arange(128 * 128, dtype=np.uint16) * 3).reshape(128, 128)).save(image_path(wd, odd[0]), "PNG")
    Image.open(image_path(wd, odd[1])).convert("CMYK").save(image_path(wd, odd[1]), "JPEG")
    run_alone(wd, cfg, "ingest")  # completes
    truncated, empty, not_an_image, gone_after_ingest = bad[1:5]
    data = image_path(wd, truncated).read_bytes()
    image_path(wd, truncated).write_bytes(data[: len(data) // 2])
    image_path(wd, empty).write_bytes(b"")
    image_path(wd, not_an_image).write_text("this is not a JPEG\n")
    image_path(wd, gone_after_ingest).unlink()

    summary = run_alone(wd, cfg, "features")  # completes

    assert summary["rejected"] == 6 and summary["images"] == len(images) - 6
    catalog = Catalog(wd)
    rows = catalog.query("SELECT source_file, reason FROM rejects WHERE source_file LIKE 'images/%'").to_pylist()
    reasons = {r["source_file"].removeprefix("images/"): r["reason"] for r in rows}
    assert reasons[gone_before_ingest] == reasons[gone_after_ingest] == "image file missing"
    assert reasons[truncated].startswith("image does not decode:") and "truncated" in reasons[truncated]
    assert reasons[empty] == "image does not decode: empty file (0 bytes)"
    assert reasons[not_an_image] == "image does not decode: not a JPEG, PNG, WebP, GIF, BMP or TIFF image"
    assert reasons[bomb].startswith("image does not decode: refused by Pillow as a decompression bomb")
    extracted = catalog.extracted_image_ids("embedded", catalog.current_extractor("embedded", cfg.features))
    stem = lambda name: name.removesuffix(".jpg")  # noqa: E731 - image ids are the file names' stems
    assert extracted == {stem(name) for name in images} - {stem(name) for name in bad}

    # A rebuild retries only the rejects (a fixed file gets its features), and rejects are not duplicated.
    image_path(wd, empty).write_bytes(data)
    assert run_alone(wd, cfg, "features", force=False)["reused"]  # ingest has not seen the new bytes yet
    run_alone(wd, cfg, "ingest", force=False)
    again = run_alone(wd, cfg, "features", force=False)
    assert again["extracted_now"] == 1 and again["rejected"] == 5
    assert catalog.query("SELECT count(*) AS n FROM rejects WHERE source_file LIKE 'images/%'")["n"][0].as_py() == 5

    # Training data leaves the images without features out, and says how many.
    from mule.data_catalog.splits import load_split, load_vocabulary

    run_alone(wd, cfg, "text")
    vocabulary = load_vocabulary(catalog, "embedded", ["en", "de", "fr", "cs"])
    extractor = catalog.current_extractor("embedded", cfg.features)
    with caplog.at_level(logging.WARNING, logger="mule.tasks"):
        split = load_split(catalog, "embedded", "train", vocabulary, 32, extractor)
    left_out = {stem(name) for name in (gone_before_ingest, truncated, not_an_image, gone_after_ingest, bomb)}
    train_ids = set(catalog.query("SELECT image_id FROM images WHERE role = 'train'")["image_id"].to_pylist())
    assert left_out <= train_ids and set(split.image_ids) == train_ids - left_out
    assert "train: 5 images have no features" in caplog.text


SMALL = {**TINY, "data.train_images": 8, "data.val_images": 4, "data.test_images": 4, "features.shard_images": 4}


@pytest.mark.slow
def test_dask_and_in_process_runs_give_the_same_table(tmp_path):
    from mule.flows.stages import features_flow

    local, cfg = ingested(tmp_path / "local", SMALL)
    shutil.copytree(local.root, tmp_path / "dask")
    run_alone(local, cfg, "features")
    overrides = {**SMALL, "features.runner": "dask", "features.dask_workers": 2}
    summary = features_flow(workdir=str(tmp_path / "dask"), overrides=overrides)
    assert summary["extracted_now"] == 16 and summary["rejected"] == 0

    def table(wd: Workdir):
        extractor = Catalog(wd).current_extractor("embedded", cfg.features)
        parts = Catalog(wd).feature_parts("embedded", extractor)
        rows = {}
        for part in parts:
            t = pq.read_table(part)
            rows.update(zip(t["image_id"].to_pylist(), np.stack(t["vector"].to_numpy(zero_copy_only=False))))
        return rows, len(parts)

    dask_wd = Workdir.at(tmp_path / "dask")
    adopt(dask_wd)
    (ours, n_local), (theirs, n_dask) = table(local), table(dask_wd)
    assert n_local == n_dask == 4  # 16 images in shards of 4, one part each, whoever wrote it
    assert sorted(ours) == sorted(theirs)  # same rows, no duplicates
    for image_id, vector in ours.items():
        np.testing.assert_allclose(theirs[image_id], vector, rtol=1e-4, atol=1e-5)


def test_a_worker_whose_run_stopped_writes_nothing(tmp_path):
    """A Dask worker on another machine keeps computing after mule stopped: the shard it
    finishes then (the workdir's lock released, or held by another run) is not written,
    so nothing changes a workdir that no run holds."""
    import subprocess
    import sys
    from dataclasses import asdict

    from mule.pipeline.runner import prepare
    from mule.storage.locks import run_token, workdir_lock
    from mule.tasks.features import extract_shard, plan_features
    from mule.tasks.shared.context import StageContext

    wd, cfg = ingested(tmp_path / "work", {**TINY, "data.train_images": 8, "data.val_images": 4, "data.test_images": 4})
    prepare(wd, cfg, "features")
    with workdir_lock(wd, "features"):
        plan = plan_features(StageContext(wd, cfg))
        token = run_token(wd)
    assert plan["shards"] and all(s["run"] == token for s in plan["shards"])
    # the run is over: the shard, finished now on a "remote" worker (another process), is dropped
    code = (f"from mule.tasks.features import extract_shard; r = extract_shard({str(wd.root)!r}, "
            f"{asdict(cfg.features)!r}, 'embedded', {plan['extractor']!r}, {plan['shards'][0]!r}, 16); "
            "print(r.get('discarded'), r['part'])")  # fmt: skip
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.stdout.split()[-2:] == ["True", "None"], done.stdout + done.stderr
    assert not Catalog(wd).feature_parts("embedded", plan["extractor"])
    # another run holds the workdir now: not written either; the run that planned it: written
    with workdir_lock(wd, "features"):
        late = extract_shard(str(wd.root), asdict(cfg.features), "embedded", plan["extractor"], plan["shards"][0], 16)
        assert late.get("discarded") and late["part"] is None
        plan = plan_features(StageContext(wd, cfg))
        own = extract_shard(str(wd.root), asdict(cfg.features), "embedded", plan["extractor"], plan["shards"][0], 16)
        assert own["part"] and own["extracted"] > 0
