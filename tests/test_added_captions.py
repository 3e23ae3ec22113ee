"""A table of an added language's captions, read against the dataset's images
(datasets/readers/added_captions.py): hand-made files, every way a row finds its image,
every reject with its line and reason."""

from __future__ import annotations

import json

import pyarrow as pa
import pytest

from mule.datasets.readers.added_captions import AddedCaptionsError, read_added_captions
from mule.datasets.readers.base import ReadOptions

IMAGES = pa.table({"image_id": ["1000092795", "10002456", "1001773457"],
                   "file_name": ["1000092795.jpg", "10002456.jpg", "1001773457.jpg"],
                   "path": ["/photos/1000092795.jpg", "/photos/10002456.jpg", "/photos/1001773457.jpg"],
                   "split": ["train", "val", "test_2016"], "role": ["train", "val", "test"]})  # fmt: skip


def read(path, lang="es", **options):
    return read_added_captions(path, lang, "multi30k+es", IMAGES, ReadOptions((lang,), **options))


def test_rows_find_their_image_by_id_file_or_path_and_take_its_split(tmp_path):
    table = tmp_path / "es.csv"
    table.write_text("image,caption\n"
                     "1000092795,Dos perros juegan.\n"  # its id
                     "10002456.jpg,Un hombre corre.\n"  # its file's name
                     "photos/1001773457.jpg,Una niña sonríe.\n")  # a path ending in its file  # fmt: skip
    found = read(table)
    assert found.captions.column("image_id").to_pylist() == ["1000092795", "10002456", "1001773457"]
    assert found.captions.column("split").to_pylist() == ["train", "val", "test_2016"]
    assert found.captions.column("role").to_pylist() == ["train", "val", "test"]
    assert set(found.captions.column("lang").to_pylist()) == {"es"} and found.rejects.num_rows == 0
    assert found.captions.column("caption_id").to_pylist() == ["es.csv:2", "es.csv:3", "es.csv:4"]
    assert found.notes["captions"] == {"train": 1, "val": 1, "test_2016": 1}


def test_every_row_that_cannot_be_read_is_a_reject_with_its_line_and_reason(tmp_path):
    table = tmp_path / "es.csv"
    table.write_text("file_name,caption,lang,split\n"
                     "1000092795.jpg,Dos perros juegan.,es,train\n"
                     "1000092795.jpg,Dos perros juegan.,Spanish,train\n"  # a repeat (its language by name)
                     "9999.jpg,Un gato.,es,train\n"  # no such image
                     "10002456.jpg,Un hombre corre.,es,test\n"  # its image is in val
                     "1001773457.jpg,,es,\n"  # empty
                     "1001773457.jpg,Zwei Hunde.,de,\n"  # another language: left out and counted
                     "1001773457.jpg,Un perro.,xx,\n")  # no language  # fmt: skip
    found = read(table)
    assert found.captions.column("text").to_pylist() == ["Dos perros juegan."]
    rejects = [(r["line"], r["kind"]) for r in found.rejects.to_pylist()]
    assert rejects == [(3, "duplicate"), (4, "no_image"), (5, "split_conflict"), (6, "empty"), (8, "bad_language")]
    reasons = found.rejects.column("reason").to_pylist()
    assert "no image of dataset 'multi30k+es' is named '9999.jpg'" in reasons[1]
    assert "image '10002456' is in split val, the row says test" in reasons[2]
    assert found.notes["other_languages"] == {"de": 1}
    with pytest.raises(AddedCaptionsError, match="data.strict=true"):
        read(table, strict=True)


def test_xflickrco_s_records_are_read_as_its_reader_reads_them(tmp_path):
    """{"sentences": [...], "id": ..., "img_path": ...}: every sentence a caption, the image
    by its id, and the alignment digits of Japanese removed as xFlickr&CO released them."""
    table = tmp_path / "test.jsonl"
    rows = [{"sentences": ["耳ピアスをした1男が、3メガネをかけている。"], "id": "1001773457", "img_path": "1001773457.jpg"},
            {"sentences": ["2犬が走っている。", "犬が走る。"], "id": "1000092795", "img_path": "1000092795.jpg"}]  # fmt: skip
    table.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    found = read(table, lang="ja")
    assert found.captions.column("text").to_pylist() == ["耳ピアスをした男が、メガネをかけている。", "犬が走っている。",
                                                         "犬が走る。"]  # fmt: skip
    assert found.captions.column("caption_id").to_pylist() == ["test.jsonl:1", "test.jsonl:2#1", "test.jsonl:2#2"]
    assert found.notes["alignment_digits_removed"] == 2


def test_a_table_without_an_image_or_caption_column_is_one_error_naming_its_columns(tmp_path):
    table = tmp_path / "es.csv"
    table.write_text("picture_name,text_es\nx.jpg,Un perro.\n")
    with pytest.raises(AddedCaptionsError, match="no image column: expected one of file_name, .* the columns are "
                                                 "picture_name, text_es"):  # fmt: skip
        read(table)
    with pytest.raises(AddedCaptionsError, match="no such file"):
        read(tmp_path / "missing.csv")
