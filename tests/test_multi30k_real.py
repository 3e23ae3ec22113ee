"""Ingest of the official Multi30K text in ../shared, checked against the raw files."""

import gzip
from pathlib import Path

import pytest

from mule.config.resolution import resolve
from mule.pipeline.runner import run_alone
from mule.storage.workdir import Workdir

SPLITS = {"train": ("train", "train"), "val": ("val", "val"), "test_2016": ("test_2016_flickr", "test_2016")}


def lines(path: Path) -> list[str]:
    return [line.rstrip("\n").strip() for line in gzip.open(path, "rt", encoding="utf-8")]


def expected_counts(root: Path) -> dict[tuple[str, str], int]:
    """Captions per (split, lang) computed straight from the files: every non-empty line,
    except task1 English lines that repeat one of the image's task2 English lines."""
    data = root / "data"
    out: dict[tuple[str, str], int] = {}
    for split, (stem1, stem2) in SPLITS.items():
        task2_en = [lines(data / f"task2/raw/{stem2}.{k}.en.gz") for k in range(1, 6)]
        for lang in ("en", "de"):
            out[(split, lang)] = sum(
                sum(1 for x in lines(data / f"task2/raw/{stem2}.{k}.{lang}.gz") if x) for k in range(1, 6)
            )
        for lang in ("en", "de", "fr", "cs"):
            task1 = lines(data / f"task1/raw/{stem1}.{lang}.gz")
            if lang == "en":
                kept = [x for i, x in enumerate(task1) if x and x not in {t[i] for t in task2_en}]
            else:
                kept = [x for x in task1 if x]
            out[(split, lang)] = out.get((split, lang), 0) + len(kept)
    return out


@pytest.mark.slow
def test_ingest_of_the_real_multi30k_text(shared_multi30k, tmp_path):
    """The reader on the real release, every line of it, tokenised by the regex tokenizer:
    with Moses (pure Python) the test took 20 s alone instead of 13 (30 s beside the other
    worker); Moses reads the real text in tests/test_real_photos.py (a slice, through
    every stage)."""
    cfg = resolve(None, {"data.dataset": "multi30k", "data.source": str(shared_multi30k),
                         "text.tokenizers": "en=unicode,de=unicode,fr=unicode,cs=unicode"})  # fmt: skip
    summary = run_alone(Workdir.at(tmp_path), cfg, "ingest")
    from mule.data_catalog.tables import Catalog

    catalog = Catalog(Workdir.at(tmp_path))
    images = {r["split"]: r for r in catalog.query(
        """SELECT split, count(*) AS n, sum(CASE WHEN "exists" THEN 1 ELSE 0 END) AS present
           FROM images WHERE dataset = 'multi30k' GROUP BY split""").to_pylist()}  # fmt: skip
    assert (images["train"]["n"], images["val"]["n"], images["test_2016"]["n"]) == (29000, 1014, 1000)
    assert all(row["present"] == 0 for row in images.values())  # no images in ../shared: recorded as missing

    got = {(r["split"], r["lang"]): r["n"] for r in catalog.query(
        "SELECT split, lang, count(*) AS n FROM captions WHERE dataset = 'multi30k' GROUP BY ALL").to_pylist()}  # fmt: skip
    expected = expected_counts(shared_multi30k)
    assert {k: got.get(k) for k in expected} == expected
    assert expected[("train", "en")] == 145000 and expected[("train", "fr")] == 29000  # 5 per image; 1 per image
    assert summary["merged_task1_lines"] == 31014  # every task1 English line repeats a task2 one
    assert summary["rejects"] == 0
    # Tokens are there, and the caption ids point at real lines.
    row = catalog.query("SELECT * FROM captions WHERE caption_id = 'data/task1/raw/train.cs.gz:1'").to_pylist()[0]
    assert row["text"] == lines(shared_multi30k / "data/task1/raw/train.cs.gz")[0]
    assert row["tokens"][:2] == ["dva", "mladí"] and row["origin_caption_id"].startswith("data/task2/raw/train.")
