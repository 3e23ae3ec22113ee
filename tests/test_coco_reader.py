"""The MSCOCO reader (English COCO captions, Japanese YJ / STAIR, Chinese COCO-CN) on
small hand-written files in the exact published formats, and the paper's split rule."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mule.datasets.readers.base import ReadOptions
from mule.datasets.readers.coco import CocoError, CocoOptions, read_coco

TRI = ReadOptions(("en", "ja", "zh"))


def coco_json(images: list[tuple[int, str]], annotations: list[tuple[int, int, object]]) -> dict:
    """COCO captions layout: info, licenses, images[{id, file_name, ...}], annotations[{image_id, id, caption}]."""
    return {
        "info": {"description": "COCO 2014 Dataset", "version": "1.0", "year": 2014},
        "licenses": [{"id": 1, "name": "Attribution-NonCommercial-ShareAlike License", "url": ""}],
        "images": [{"license": 1, "file_name": name, "coco_url": "", "height": 480, "width": 640,
                    "date_captured": "2013-11-14 16:28:13", "flickr_url": "", "id": i} for i, name in images],
        "annotations": [{"image_id": i, "id": a, "caption": c} for i, a, c in annotations],
    }  # fmt: skip


def write(path: Path, content) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(content if isinstance(content, str) else json.dumps(content, ensure_ascii=False), encoding="utf-8")


@pytest.fixture
def coco(tmp_path) -> Path:
    """Three images: 9 (en, ja, zh), 25 (en, ja), 42 (en, zh, only in val2014)."""
    root = tmp_path / "coco"
    write(root / "annotations/captions_train2014.json", coco_json(
        [(9, "COCO_train2014_000000000009.jpg"), (25, "COCO_train2014_000000000025.jpg")],
        [(9, 1, "Closeup of bins of food that include broccoli and bread."), (9, 2, "A meal is presented in brightly colored plastic trays.\n"),
         (25, 3, "A giraffe eating food from the top of the tree.")]))  # fmt: skip
    write(root / "annotations/captions_val2014.json", coco_json(
        [(42, "COCO_val2014_000000000042.jpg")], [(42, 4, "A bicycle replica with a clock as the front wheel.")]))  # fmt: skip
    write(root / "yjcaptions26k_clean.json", coco_json(
        [(9, "COCO_train2014_000000000009.jpg"), (25, "COCO_train2014_000000000025.jpg")],
        [(9, 10, "ブロッコリーとパンが入った容器。"), (25, 11, "キリンが木の上の葉を食べている。"),
         (25, 12, "背の高いキリンが立っている。")]))  # fmt: skip
    write(root / "coco-cn/imageid.human-written-caption.txt",
          "COCO_train2014_000000000009#0\t餐盒里有西兰花和面包。\nCOCO_val2014_000000000042#0\t一个以时钟为前轮的自行车模型。\n")  # fmt: skip
    (root / "images/train2014").mkdir(parents=True)
    from PIL import Image

    Image.new("RGB", (8, 6), "red").save(root / "images/train2014/COCO_train2014_000000000009.jpg")
    return root


def read(root, **options):
    split = {"split_rule": "trilingual", "val_images": 0, "test_images": 1} | options
    return read_coco(root, "coco", options=TRI, coco=CocoOptions(**split))


def test_the_three_languages_join_on_the_coco_image_id_with_provenance(coco):
    result = read(coco)
    captions = result.captions.to_pylist()
    by_image: dict[str, set[str]] = {}
    for row in captions:
        by_image.setdefault(row["image_id"], set()).add(row["lang"])
    assert by_image == {
        "COCO_train2014_000000000009": {"en", "ja", "zh"},
        "COCO_train2014_000000000025": {"en", "ja"},
        "COCO_val2014_000000000042": {"en", "zh"},
    }
    first = next(r for r in captions if r["text"].startswith("A meal"))
    assert first["text"] == "A meal is presented in brightly colored plastic trays."  # trailing newline dropped
    assert (first["source"], first["source_file"], first["line"]) == ("coco", "annotations/captions_train2014.json", 2)
    assert first["caption_id"] == "annotations/captions_train2014.json:2"
    chinese = next(r for r in captions if r["image_id"] == "COCO_val2014_000000000042" and r["lang"] == "zh")
    assert (chinese["source"], chinese["source_file"], chinese["line"]) == (
        "coco-cn", "coco-cn/imageid.human-written-caption.txt", 2)  # fmt: skip
    japanese = [r for r in captions if r["lang"] == "ja"]
    assert [(r["source"], r["line"]) for r in japanese] == [("yj", 1), ("yj", 2), ("yj", 3)]
    images = {r["image_id"]: r for r in result.images.to_pylist()}
    assert images["COCO_train2014_000000000009"]["exists"] and images["COCO_train2014_000000000009"]["width"] == 8
    assert images["COCO_train2014_000000000009"]["path"].endswith("images/train2014/COCO_train2014_000000000009.jpg")
    assert not images["COCO_val2014_000000000042"]["exists"]  # recorded as missing, under its folder
    assert images["COCO_val2014_000000000042"]["path"].endswith("images/val2014/COCO_val2014_000000000042.jpg")
    # the only trilingual image is the test split; everything else trains
    assert {r["image_id"]: r["split"] for r in result.images.to_pylist()} == {
        "COCO_train2014_000000000009": "test", "COCO_train2014_000000000025": "train",
        "COCO_val2014_000000000042": "train"}  # fmt: skip


def test_stair_captions_and_the_choice_between_japanese_files(coco):
    write(coco / "stair_captions_v1.2_train.json", coco_json(
        [(25, "COCO_train2014_000000000025.jpg")], [(25, 20, "木の葉を食べるキリン。")]))  # fmt: skip

    def japanese(choice):
        rows = read(coco, japanese=choice, test_images=0).captions.to_pylist()
        return sorted(r["source"] for r in rows if r["lang"] == "ja")

    assert japanese("all") == ["stair", "yj", "yj", "yj"]
    assert japanese("stair") == ["stair"]
    assert japanese("yj") == ["yj", "yj", "yj"]


def test_coco_cn_second_captions_and_manual_translations(coco):
    with open(coco / "coco-cn/imageid.human-written-caption.txt", "a", encoding="utf-8") as handle:
        handle.write("COCO_train2014_000000000009#1\t桌上摆着两盒饭菜。\n")
    write(coco / "coco-cn/imageid.manually-translated-caption.txt",  # the release's layout: #zhm#<n>, one space
          "COCO_train2014_000000000025#zhm#0 一只长颈鹿在吃树顶上的食物。\n")  # fmt: skip
    rows = [r for r in read(coco).captions.to_pylist() if r["lang"] == "zh"]
    assert sorted((r["image_id"][-2:], r["source"], r["line"]) for r in rows) == [
        ("09", "coco-cn", 1), ("09", "coco-cn", 3), ("25", "coco-cn/translated", 1), ("42", "coco-cn", 2)]  # fmt: skip


def test_karpathy_split_and_its_sentences_when_no_coco_captions_file(coco):
    karpathy = {"dataset": "coco", "images": [
        {"filepath": "train2014", "sentids": [1, 2], "filename": "COCO_train2014_000000000009.jpg", "imgid": 0,
         "split": "test", "sentences": [{"tokens": ["closeup"], "raw": "Closeup of bins of food.", "imgid": 0, "sentid": 1},
                                        {"tokens": ["a", "meal"], "raw": "A meal in trays.", "imgid": 0, "sentid": 2}],
         "cocoid": 9},
        {"filepath": "train2014", "sentids": [3], "filename": "COCO_train2014_000000000025.jpg", "imgid": 1,
         "split": "restval", "sentences": [{"tokens": ["a"], "raw": "A giraffe eating.", "imgid": 1, "sentid": 3}],
         "cocoid": 25},
        {"filepath": "val2014", "sentids": [4], "filename": "COCO_val2014_000000000042.jpg", "imgid": 2,
         "split": "val", "sentences": [{"tokens": ["a"], "raw": "A bicycle replica.", "imgid": 2, "sentid": 4}],
         "cocoid": 42}]}  # fmt: skip
    write(coco / "dataset_coco.json", karpathy)
    splits = {r["image_id"][-2:]: r["split"] for r in read(coco, split_rule="karpathy").images.to_pylist()}
    assert splits == {"09": "test", "25": "train", "42": "val"}
    for path in (coco / "annotations").iterdir():
        path.unlink()
    english = [r for r in read(coco, split_rule="karpathy").captions.to_pylist() if r["lang"] == "en"]
    assert [(r["caption_id"], r["text"]) for r in english[:2]] == [
        ("dataset_coco.json:1.0", "Closeup of bins of food."), ("dataset_coco.json:1.1", "A meal in trays.")]  # fmt: skip


def many_images(root: Path, n: int, trilingual: set[int]) -> None:
    """n images with English captions; Japanese and Chinese only on `trilingual` (and a few more)."""
    images = [(i, f"COCO_train2014_{i:012d}.jpg") for i in range(1, n + 1)]
    write(root / "captions_train2014.json", coco_json(images, [(i, i, f"caption {i}") for i in range(1, n + 1)]))
    japanese = sorted(trilingual | {n})  # image n has Japanese but no Chinese
    write(
        root / "yjcaptions26k_clean.json",
        coco_json([images[i - 1] for i in japanese], [(i, i, "画像") for i in japanese]),
    )
    write(
        root / "imageid.human-written-caption.txt",
        "".join(f"COCO_train2014_{i:012d}#0\t图片\n" for i in sorted(trilingual)),
    )


def test_the_paper_split_draws_val_and_test_from_trilingual_images_seeded(tmp_path):
    trilingual = set(range(1, 61, 2))  # 30 trilingual images among 100
    many_images(tmp_path, 100, trilingual)

    def splits(seed: int) -> dict[str, list[str]]:
        result = read_coco(tmp_path, "coco", options=TRI, coco=CocoOptions("trilingual", 8, 10, seed))
        out: dict[str, list[str]] = {}
        for row in result.images.to_pylist():
            out.setdefault(row["split"], []).append(row["image_id"])
        return out

    first = splits(0)
    assert (len(first["test"]), len(first["val"]), len(first["train"])) == (10, 8, 82)
    assert {int(i[-12:]) for i in first["test"] + first["val"]} <= trilingual
    assert splits(0) == first and splits(1)["test"] != first["test"]
    with pytest.raises(CocoError, match=r"only 30 images have captions in every language \(en, ja, zh\)"):
        read_coco(tmp_path, "coco", options=TRI, coco=CocoOptions("trilingual", 1000, 1000))


def test_the_coco_cn_split_as_an_option(coco):
    write(coco / "coco-cn/coco-cn_test.txt", "COCO_val2014_000000000042\n")
    write(coco / "coco-cn/coco-cn_val.txt", "COCO_train2014_000000000009\n")
    splits = {r["image_id"][-2:]: r["split"] for r in read(coco, split_rule="coco-cn").images.to_pylist()}
    assert splits == {"09": "val", "25": "train", "42": "test"}


def test_bad_json_is_fatal_and_names_file_and_line(coco):
    (coco / "yjcaptions26k_clean.json").write_text('{"images": [],\n "annotations": [\n {"image_id": 9,, }]}')
    with pytest.raises(CocoError, match=r"^yjcaptions26k_clean\.json:3: not valid JSON at column 17"):
        read(coco)
    write(coco / "yjcaptions26k_clean.json", {"annotations": []})
    with pytest.raises(CocoError, match=r"yjcaptions26k_clean\.json: no 'images' list: not a COCO-style captions file"):
        read(coco)


def test_bad_records_are_rejected_with_their_reason(coco):
    write(coco / "yjcaptions26k_clean.json", coco_json(
        [(9, "COCO_train2014_000000000009.jpg")],
        [(9, 10, "ブロッコリー。"), (9, 11, "   "), (9, 12, "制御\x1b文字"), (777, 13, "どこ?"), (9, 14, 5)]))  # fmt: skip
    data = json.loads((coco / "yjcaptions26k_clean.json").read_text())
    data["annotations"].append({"id": 15, "caption": "no image id"})
    write(coco / "yjcaptions26k_clean.json", data)
    with open(coco / "coco-cn/imageid.human-written-caption.txt", "a", encoding="utf-8") as handle:
        handle.write("just a caption without its image\n")
    result = read(coco)
    rejects = {(r["source_file"], r["line"]): (r["kind"], r["reason"]) for r in result.rejects.to_pylist()}
    assert rejects == {
        ("yjcaptions26k_clean.json", 2): ("empty", "empty caption"),
        ("yjcaptions26k_clean.json", 3): ("control_char", "control character U+001B at column 3"),
        ("yjcaptions26k_clean.json", 4): ("no_image", "image id 777 is not in the file's images list"),
        ("yjcaptions26k_clean.json", 5): ("bad_record", "caption is int, not text"),
        ("yjcaptions26k_clean.json", 6): ("bad_record", "annotations[5]: no integer image_id or no caption"),
        ("coco-cn/imageid.human-written-caption.txt", 3): (
            "bad_line",
            "expected 'COCO_<folder>_<id>#<n>', a TAB or a space, then the caption",
        ),
    }
    assert [r["text"] for r in result.captions.to_pylist() if r["lang"] == "ja"] == ["ブロッコリー。"]
    with pytest.raises(CocoError, match=r"yjcaptions26k_clean\.json:2: empty caption \(data.strict=true"):
        read_coco(coco, "coco", options=ReadOptions(("en", "ja", "zh"), strict=True),
                  coco=CocoOptions(val_images=0, test_images=1))  # fmt: skip


def test_a_missing_language_names_the_files_it_expected(coco):
    (coco / "coco-cn/imageid.human-written-caption.txt").unlink()
    with pytest.raises(CocoError, match=r"no usable zh captions: expected COCO-CN's imageid.human-written-caption.txt"):
        read(coco)
    rows = read_coco(coco, "coco", options=ReadOptions(("en", "ja")), coco=CocoOptions(val_images=0, test_images=1))
    assert {r["lang"] for r in rows.captions.to_pylist()} == {"en", "ja"}
