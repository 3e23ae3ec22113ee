
"""The COCO-style embedded dataset: published formats, unbalanced languages, and
captions in each language's own grammar, read back by the COCO reader."""

from __future__ import annotations

import json
from collections import Counter

import pytest

from mule.datasets.readers.base import ReadOptions
from mule.datasets.readers.coco import CocoOptions, read_coco
from mule.generators.coco_layout import CocoSpec, generate_coco

SPEC = CocoSpec(images=600, val_images=20, test_images=30)


@pytest.mark.slow
def test_english_everywhere_japanese_on_a_fifth_chinese_on_a_seventh_few_in_all_three(tmp_path):
    root = generate_coco(tmp_path / "coco", SPEC)
    scenes = [json.loads(line) for line in (root / "scenes.jsonl").read_text(encoding="utf-8").splitlines()]
    counts = Counter(lang for s in scenes for lang in s["languages"])
    trilingual = sum(1 for s in scenes if len(s["languages"]) == 3)
    assert counts == {"en": 600, "ja": 120, "zh": 90}
    assert trilingual == 20 + 30 + 12  # val + test + 2% of the images
    result = read_coco(
        root, "embedded-coco", options=ReadOptions(("en", "ja", "zh")), coco=CocoOptions(val_images=20, test_images=30)
    )
    assert result.rejects.num_rows == 0 and result.images.num_rows == 600
    assert all(result.images.column("exists").to_pylist())
    split = Counter(result.images.column("split").to_pylist())
    assert split == {"train": 550, "val": 20, "test": 30}
    assert {"en", "ja", "zh"} <= set(result.stats["test"])


def test_captions_follow_each_language_grammar_and_lexicons_are_muse(tmp_path):
    root = generate_coco(tmp_path / "coco", SPEC)
    yj = json.loads((root / "yjcaptions26k_clean.json").read_text(encoding="utf-8"))
    japanese = [a["caption"] for a in yj["annotations"]]
    assert all(" " not in c for c in japanese)  # no spaces between words
    assert (
        sum(c.rstrip("。").endswith(("があります", "が描かれています", "の絵", "が見える画像")) for c in japanese)
        > len(japanese) / 2
    )
    assert any("二つ" in c or "三つ" in c for c in japanese)  # the counter つ
    chinese = (root / "coco-cn/imageid.human-written-caption.txt").read_text(encoding="utf-8").splitlines()
    assert all(line.startswith("COCO_") and "#" in line.split("\t")[0] for line in chinese)
    texts = [line.split("\t")[1] for line in chinese]
    assert sum(("一个" in t or "一颗" in t) for t in texts) > len(texts) / 2  # numeral + measure word
    assert not any("二个" in t for t in texts)  # 两个, never 二个
    for lang in ("ja", "zh"):
        pairs = [
            line.split(" ") for line in (root / f"dictionaries/en-{lang}.txt").read_text(encoding="utf-8").splitlines()
        ]
        assert pairs and all(len(p) == 2 for p in pairs)
    assert ["red", "赤い"] in [
        line.split(" ") for line in (root / "dictionaries/en-ja.txt").read_text(encoding="utf-8").splitlines()
    ]
