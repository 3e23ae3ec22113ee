"""COCO-CN as its 201805 release unpacks (li-xirong/coco-cn, data/coco-cn-version1805.tar.gz).

The release's layout, reproduced byte for byte in form with sentences written for this
test: a folder `coco-cn-version1805/` (and the archive's macOS `._*` metadata files beside
every file), `imageid.caption.txt` (name#n, a TAB, the caption), the manual translations in
`imageid.manually-translated-caption.txt` (name#zhm#n, ONE SPACE, the caption: every line
of that file was rejected before), word-segmented copies (`*.bosonseg.txt`, word:tag pairs),
tags, split lists and a script. Every caption line must be kept and nothing else read.

The real release, when it is at ../shared/datasets/coco-cn (the archive, or unpacked),
is read in full: every one of its 27,218 caption lines kept.
"""

from __future__ import annotations

import tarfile
from pathlib import Path

import pytest

from mule.datasets.readers.base import ReadOptions
from mule.datasets.readers.coco import CocoOptions, read_coco

ZH = ReadOptions(("zh",))
APPLE_DOUBLE = b"\x00\x05\x16\x07\x00\x02\x00\x00Mac OS X        \x00\x02\x00\x00\x00\t\x00\x00\x002\x00\x00\x00\x9a"

HUMAN = [  # imageid.caption.txt: a TAB after the key; an image may have #0 and #1
    "COCO_train2014_000000000009#0\t餐盒里有西兰花、面包和肉。",
    "COCO_train2014_000000000009#1\t四个彩色饭盒里装着不同的食物",
    "COCO_val2014_000000000042#0\t一辆前轮是时钟的自行车模型",
    "COCO_val2014_000000000073#0\t停车场里停着一辆白色摩托车。",
    "COCO_train2014_000000000025#0\t长颈鹿伸长脖子吃树叶",
]
TRANSLATED = [  # imageid.manually-translated-caption.txt: name#zhm#<n>, then one space
    f"COCO_val2014_000000000073#zhm#{n} {text}"
    for n, text in enumerate(
        [
            "一辆摩托车停在路边。",
            "白色的摩托车停在停车位上。",
            "一辆老式摩托车。",
            "停车场上有一辆摩托车。",
            "一辆白色的摩托车停在那里。",
        ]
    )  # fmt: skip
]


def _segmented(line: str) -> str:
    key, _, text = line.replace("\t", " ", 1).partition(" ")
    return key + " " + " ".join(f"{ch}:n" for ch in text)


@pytest.fixture
def release(tmp_path) -> Path:
    root = tmp_path / "download"
    folder = root / "coco-cn-version1805"
    folder.mkdir(parents=True)
    files = {
        "imageid.caption.txt": "\n".join(HUMAN) + "\n",
        "imageid.manually-translated-caption.txt": "\n".join(TRANSLATED) + "\n",
        "imageid.caption.bosonseg.txt": "\n".join(map(_segmented, HUMAN)) + "\n",
        "imageid.manually-translated-caption.bosonseg.txt": "\n".join(map(_segmented, TRANSLATED)) + "\n",
        "imageid.tags.txt": "COCO_train2014_000000000009 食物 西兰花\nCOCO_val2014_000000000073 摩托车\n",
        "coco-cn_train.txt": "COCO_train2014_000000000009\nCOCO_train2014_000000000025\n",
        "coco-cn_val.txt": "COCO_val2014_000000000042\n",
        "coco-cn_test.txt": "COCO_val2014_000000000073\n",
        "verify_data.py": "print('okay')\n",
    }
    for name, text in files.items():
        (folder / name).write_text(text, encoding="utf-8")
        (folder / f"._{name}").write_bytes(APPLE_DOUBLE)  # what a Mac's tar puts beside every file
    (root / "._coco-cn-version1805").write_bytes(APPLE_DOUBLE)
    return root


def test_every_caption_line_of_the_release_layout_is_kept(release):
    result = read_coco(release, "coco", options=ZH, coco=CocoOptions(split_rule="coco-cn"))
    assert result.rejects.num_rows == 0, result.rejects.to_pylist()
    rows = result.captions.to_pylist()
    by_source = {}
    for row in rows:
        by_source.setdefault(row["source"], []).append((row["source_file"], row["line"], row["text"]))
    assert sorted(by_source["coco-cn"]) == sorted(
        ("coco-cn-version1805/imageid.caption.txt", n, line.split("\t")[1]) for n, line in enumerate(HUMAN, 1)
    )
    translated = sorted(by_source["coco-cn/translated"])
    assert translated == [("coco-cn-version1805/imageid.manually-translated-caption.txt", n, line.split(" ", 1)[1])
                          for n, line in enumerate(TRANSLATED, 1)]  # fmt: skip
    assert set(by_source) == {"coco-cn", "coco-cn/translated"}  # no segmented, tag or metadata file read as captions
    splits = {r["image_id"]: r["split"] for r in result.images.to_pylist()}
    assert splits == {"COCO_train2014_000000000009": "train", "COCO_train2014_000000000025": "train",
                      "COCO_val2014_000000000042": "val", "COCO_val2014_000000000073": "test"}  # fmt: skip
    assert result.stats["test"] == {"images": 1, "zh": 6}


def _real_release() -> Path | None:
    base = Path(__file__).resolve().parents[2] / "shared" / "datasets" / "coco-cn"
    if (base / "coco-cn-version1805" / "imageid.caption.txt").is_file():
        return base
    return None


@pytest.mark.slow
def test_the_real_release_ingests_every_caption_line(tmp_path):
    base = Path(__file__).resolve().parents[2] / "shared" / "datasets" / "coco-cn"
    root = _real_release()
    if root is None and (base / "coco-cn-version1805.tar.gz").is_file():
        with tarfile.open(base / "coco-cn-version1805.tar.gz") as archive:
            archive.extractall(tmp_path, filter="data")
        root = tmp_path
    if root is None:
        pytest.skip(f"the real COCO-CN release is not at {base} (coco-cn-version1805.tar.gz or unpacked)")
    result = read_coco(root, "coco", options=ZH, coco=CocoOptions(split_rule="coco-cn"))
    assert result.rejects.num_rows == 0
    sources = result.captions.column("source").to_pylist()
    assert (sources.count("coco-cn"), sources.count("coco-cn/translated")) == (22218, 5000)
    assert {k: v["images"] for k, v in result.stats.items()} == {"train": 18341, "val": 1000, "test": 1000}
