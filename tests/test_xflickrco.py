"""xFlickr&CO's captions (datasets/readers/xflickrco.py) joined to a dataset's own images:
each file's split as data.extra_files names it, every bad row a reject with its reason, the
Japanese alignment digits removed and counted."""

from __future__ import annotations

import json

import pyarrow as pa
import pytest

from mule.data_catalog.schemas import CAPTIONS, REJECTS
from mule.datasets.readers.base import ReadOptions
from mule.datasets.readers.xflickrco import ExtraCaptionsError, provided_languages, read_extra_captions

READ = CAPTIONS.remove(CAPTIONS.get_field_index("tokens"))
IMAGES = pa.table({"image_id": ["100", "101", "200", "300"], "split": ["train", "train", "val", "test_2016"],
                   "role": ["train", "train", "val", "test"]})  # fmt: skip


def write(folder, lang: str, name: str, rows: list) -> None:
    (folder / lang).mkdir(parents=True, exist_ok=True)
    lines = [r if isinstance(r, str) else json.dumps(r, ensure_ascii=False) for r in rows]
    (folder / lang / f"{name}.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")


def read(folder, files, languages=("en", "es", "ja")):
    return read_extra_captions(folder, files, "multi30k", IMAGES, ReadOptions(languages), READ, REJECTS)


def test_each_file_joins_the_split_it_is_given_and_bad_rows_are_rejects(tmp_path):
    write(tmp_path, "es", "train_100", [
        {"sentences": ["Un perro corre."], "id": "100", "img_path": "100.jpg"},
        {"sentences": ["Dos niños juegan.", "Niños en un parque."], "id": "101", "img_path": "101.jpg"},
        {"sentences": ["Una foto que no está."], "id": "999", "img_path": "999.jpg"},  # no such image
        {"sentences": ["Una foto de validación."], "id": "200", "img_path": "200.jpg"},  # not a training image
        "{not json",
    ])  # fmt: skip
    write(tmp_path, "es", "test", [
        {"sentences": ["Un hombre con sombrero."], "id": "300", "img_path": "300.jpg"},
        {"sentences": ["Un entrenamiento."], "id": "100", "img_path": "100.jpg"},  # a training image
    ])  # fmt: skip
    write(tmp_path, "en", "test", [{"sentences": ["A man in a hat."], "id": "300", "img_path": "300.jpg"}])
    write(tmp_path, "ru", "test", [{"sentences": ["Мужчина в шляпе."], "id": "300", "img_path": "300.jpg"}])
    found = read(tmp_path, {"train_100": "train", "test": "test_xflickrco"})
    rows = sorted((r["lang"], r["image_id"], r["split"], r["role"], r["text"]) for r in found.captions.to_pylist())
    assert rows == [
        ("en", "300", "test_xflickrco", "extra", "A man in a hat."),
        ("es", "100", "train", "train", "Un perro corre."),
        ("es", "101", "train", "train", "Dos niños juegan."),
        ("es", "101", "train", "train", "Niños en un parque."),
        ("es", "300", "test_xflickrco", "extra", "Un hombre con sombrero."),
    ]  # ru is not in data.languages: not read
    rejects = [(r["source_file"], r["line"], r["kind"]) for r in found.rejects.to_pylist()]
    assert rejects == [(f"{tmp_path.name}/es/train_100.jsonl", 3, "no_image"),
                       (f"{tmp_path.name}/es/train_100.jsonl", 4, "split_conflict"),
                       (f"{tmp_path.name}/es/train_100.jsonl", 5, "bad_record"),
                       (f"{tmp_path.name}/es/test.jsonl", 2, "split_conflict")]  # fmt: skip
    reasons = [r["reason"] for r in found.rejects.to_pylist()]
    assert reasons[1] == "image 200 is in split val, not train (data.extra_files gives train_100.jsonl split train)"
    assert reasons[3] == "image 100 is a training image (split train): split test_xflickrco measures images never trained on"
    assert found.languages == ("en", "es")
    assert found.notes["extra_captions"]["captions"] == {"en": {"test_xflickrco": 1}, "es": {"train": 3, "test_xflickrco": 1}}


def test_the_japanese_alignment_digits_are_removed_and_counted(tmp_path):
    write(tmp_path, "ja", "test", [
        {"sentences": ["耳ピアスをした1男が、3メガネをかけて2二人の女性と話している。"], "id": "300", "img_path": "300.jpg"},
    ])  # fmt: skip
    found = read(tmp_path, {"test": "test_xflickrco"})
    assert found.captions.column("text").to_pylist() == ["耳ピアスをした男が、メガネをかけて二人の女性と話している。"]
    assert found.notes["extra_captions"]["ja_alignment_digits_removed"] == 1


def test_a_folder_without_the_named_files_is_one_clear_error(tmp_path):
    assert provided_languages(tmp_path, {"train_100": "train"}, ("es",)) == ()
    with pytest.raises(ExtraCaptionsError, match=r"none of the files train_100.jsonl is there for a language of "
                                                  r"data.languages \(es\)"):  # fmt: skip
        read(tmp_path, {"train_100": "train"}, ("es",))
    with pytest.raises(ExtraCaptionsError, match="names no file: set data.extra_files"):
        read(tmp_path, {})
    with pytest.raises(ExtraCaptionsError, match="no such folder"):
        read(tmp_path / "absent", {"test": "test_xflickrco"})


def test_a_file_named_for_one_language_replaces_the_one_named_for_all(tmp_path):
    """`train_100=train,ja/train_1500=train,es/none=train,test=test_x`: for the train split ja
    reads its own file, es its own (not there: none), en the one named for every language;
    every language reads test.jsonl."""
    for lang in ("en", "es", "ja"):
        write(tmp_path, lang, "train_100", [{"sentences": [f"{lang} hundred"], "id": "100", "img_path": "100.jpg"}])
        write(tmp_path, lang, "test", [{"sentences": [f"{lang} test"], "id": "300", "img_path": "300.jpg"}])
    write(tmp_path, "ja", "train_1500", [{"sentences": ["ja many"], "id": "101", "img_path": "101.jpg"}])
    found = read(tmp_path, {"train_100": "train", "ja/train_1500": "train", "es/none": "train", "test": "test_x"})
    assert sorted(found.captions.column("text").to_pylist()) == ["en hundred", "en test", "es test", "ja many", "ja test"]
