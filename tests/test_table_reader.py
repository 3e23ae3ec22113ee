"""The table layout (datasets/readers/table.py): a folder of images and one captions
table, as a user brings it. Every file kind in both forms reads to the same captions; a
seeded split keeps every image where it was when rows are added; bad input is rejected
with file, line and reason, or is one clear error when the table cannot be read."""

from __future__ import annotations

import csv
import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from PIL import Image

from mule.datasets.readers.base import ReadOptions
from mule.datasets.readers.table import TableOptions, read_table
from mule.datasets.readers.table_files import TableError
from mule.datasets.readers.table_splits import seeded_role

ROWS = [  # (image, caption, lang, split): long form
    ("photos/a.jpg", "Un círculo rojo, a la izquierda.", "es", "train"),
    ("photos/a.jpg", "Czerwone koło po lewej.", "pl", "train"),
    ("photos/b.jpg", 'Una estrella "azul" y un cuadrado', "es", "train"),
    ("photos/b.jpg", "Niebieska gwiazda i kwadrat.", "pl", "train"),
    ("photos/c.jpg", "Un corazón verde.", "es", "val"),
    ("photos/c.jpg", "Zielone serce.", "pl", "val"),
    ("photos/d.jpg", "Dos cruces negras.", "es", "test"),
    ("photos/d.jpg", "Dwa czarne krzyże.", "pl", "test"),
]


def images(folder, names=("a", "b", "c", "d")):
    (folder / "photos").mkdir(parents=True, exist_ok=True)
    for n, name in enumerate(names):
        Image.new("RGB", (8, 6), (40 * n % 256, 80, 120)).save(folder / "photos" / f"{name}.jpg")


def read(folder, languages=("es", "pl"), strict=False, **table):
    return read_table(folder, "mine", folder / "images", False, None, ReadOptions(languages, strict), TableOptions(**table))


def captions(result):
    t = result.captions.to_pydict()
    return sorted(zip(t["image_id"], t["lang"], t["text"], t["split"]))


def rejects(result):
    t = result.rejects.to_pydict()
    return [(line, kind, reason) for line, kind, reason in zip(t["line"], t["kind"], t["reason"])]


def write_long(path, rows, header=("file_name", "caption", "lang", "split")):
    suffix = path.suffix
    records = [dict(zip(header, r)) for r in rows]
    if suffix in (".csv", ".tsv"):
        with open(path, "w", newline="", encoding="utf-8") as f:
            w = csv.writer(f, delimiter="\t" if suffix == ".tsv" else ",")
            w.writerow(header)
            w.writerows(rows)
    elif suffix == ".jsonl":
        path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records), encoding="utf-8")
    else:
        pq.write_table(pa.Table.from_pylist(records), path)


def wide_rows():
    by_image: dict[str, dict] = {}
    for image, text, lang, split in ROWS:
        by_image.setdefault(image, {"file_name": image, "split": split})[f"caption_{lang}"] = text
    return list(by_image.values())


EXPECTED = sorted((image, lang, text, split) for image, text, lang, split in ROWS)


@pytest.mark.parametrize("name", ["captions.csv", "captions.tsv", "captions.jsonl", "captions.parquet"])
def test_every_file_kind_in_long_form_reads_the_same_captions(tmp_path, name):
    images(tmp_path)
    write_long(tmp_path / name, ROWS)
    result = read(tmp_path)
    assert captions(result) == EXPECTED
    assert result.rejects.num_rows == 0
    assert sorted(result.images.column("image_id").to_pylist()) == [f"photos/{n}.jpg" for n in "abcd"]
    assert result.stats["train"] == {"images": 2, "es": 2, "pl": 2}


@pytest.mark.parametrize("name", ["metadata.csv", "metadata.jsonl", "metadata.parquet", "captions.tsv"])
def test_the_wide_form_and_hugging_face_imagefolder_metadata(tmp_path, name):
    images(tmp_path)
    records = [{**r, "photographer": "me"} for r in wide_rows()]  # an extra column, as imagefolder allows
    header = ("file_name", "split", "caption_es", "caption_pl", "photographer")
    write_long(tmp_path / name, [tuple(r[h] for h in header) for r in records], header)
    result = read(tmp_path)
    assert captions(result) == EXPECTED
    assert result.notes["table"]["form"] == "wide" and result.notes["table"]["ignored"] == ["photographer"]


def test_columns_named_otherwise_are_given_by_data_columns(tmp_path):
    images(tmp_path)
    write_long(tmp_path / "captions.csv", ROWS, ("foto", "beschreibung", "sprache", "teil"))
    with pytest.raises(TableError, match=r"captions.csv: no image column: .* the columns are foto, beschreibung"):
        read(tmp_path)
    result = read(tmp_path, columns={"image": "foto", "caption": "beschreibung", "lang": "sprache", "split": "teil"})
    assert captions(result) == EXPECTED
    with pytest.raises(TableError, match="data.columns names image=bild, but the table's columns are foto"):
        read(tmp_path, columns={"image": "bild"})


def test_a_table_in_one_language_needs_no_language_column(tmp_path):
    images(tmp_path)
    rows = [(i, t, s) for i, t, lang, s in ROWS if lang == "es"]
    write_long(tmp_path / "captions.csv", rows, ("image", "text", "split"))
    assert [c[1] for c in captions(read(tmp_path, languages=("es",)))] == ["es"] * 4
    with pytest.raises(TableError, match="no language column"):
        read(tmp_path, languages=("es", "pl"))


def test_paths_relative_to_the_images_folder_and_through_a_linked_folder(tmp_path):
    store = tmp_path / "elsewhere"
    images(store)
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "images").symlink_to(store, target_is_directory=True)
    write_long(tmp_path / "data" / "captions.csv", ROWS)
    result = read(tmp_path / "data")  # photos/a.jpg is under data/images/ (a link), not beside the table
    assert captions(result) == EXPECTED
    assert all(p.startswith(str(tmp_path / "data" / "images")) for p in result.images.column("path").to_pylist())


def test_a_seeded_split_is_by_image_and_stable_when_rows_are_added(tmp_path):
    names = [f"p{i:03d}" for i in range(200)]
    images(tmp_path, names)
    rows = [(f"photos/{n}.jpg", f"caption {lang} {n} {k}", lang, "") for n in names[:120] for lang in ("es", "pl") for k in (1, 2)]
    write_long(tmp_path / "captions.csv", rows)
    first = read(tmp_path, val_share=0.1, test_share=0.2, split_seed=7)
    split_of = dict(zip(first.images.column("image_id").to_pylist(), first.images.column("split").to_pylist()))
    counts = {s: list(split_of.values()).count(s) for s in ("train", "val", "test")}
    assert counts["val"] in range(4, 25) and counts["test"] in range(12, 38) and sum(counts.values()) == 120
    # an image's captions never span splits
    t = first.captions.to_pydict()
    assert all(split_of[i] == s for i, s in zip(t["image_id"], t["split"]))
    # rows appended (new images, and more captions of old ones): every image keeps its split
    more = [(f"photos/{n}.jpg", f"another {n}", "es", "") for n in names[100:200]]
    write_long(tmp_path / "captions.csv", rows + more)
    second = read(tmp_path, val_share=0.1, test_share=0.2, split_seed=7)
    after = dict(zip(second.images.column("image_id").to_pylist(), second.images.column("split").to_pylist()))
    assert {i: after[i] for i in split_of} == split_of and len(after) == 200
    assert all(after[i] == seeded_role(i, TableOptions(val_share=0.1, test_share=0.2, split_seed=7)) for i in after)
    # another seed draws other images
    assert dict(zip(*[read(tmp_path, split_seed=8).images.column(c).to_pylist() for c in ("image_id", "split")])) != after


def test_bad_rows_are_rejected_with_file_line_and_reason(tmp_path):
    images(tmp_path)
    (tmp_path / "photos" / "broken.jpg").write_bytes(b"\xff\xd8 not really a jpeg")
    lines = [
        "file_name,caption,lang,split",
        "photos/a.jpg,Un círculo rojo.,es,train",  # 2: fine
        "photos/missing.jpg,Una cruz.,es,train",  # 3: no such image
        "photos/broken.jpg,Una cruz.,es,train",  # 4: not an image
        "photos/b.jpg,   ,es,train",  # 5: empty caption
        "photos/b.jpg,Una estrella.,xyzzy,train",  # 6: neither a language code nor a language's name
        "photos/a.jpg,Un círculo rojo.,es,train",  # 7: the same row as line 2
        "photos/b.jpg,Una estrella.,es,holdout",  # 8: no split
        "photos/b.jpg,Una,estrella,es,train",  # 9: an unquoted comma
        "photos/a.jpg,Czerwone koło.,pl,test",  # 10: a.jpg is in train (line 2)
        "photos/c.jpg,Zielone serce.,pl,val",  # 11: fine
        "photos/d.jpg,Un corazón.,es,test",  # 12: fine
        "photos/d.jpg,Serce.,pl,test",  # 13: fine
        "photos/a.jpg,Koło.,pl,train",  # 14: fine
        "photos/c.jpg,Un corazón verde.,es,val",  # 15: fine
    ]
    (tmp_path / "captions.csv").write_text("\n".join(lines) + "\n", encoding="utf-8")
    result = read(tmp_path)
    got = rejects(result)
    assert [(line, kind) for line, kind, _ in got] == [
        (3, "no_image"), (4, "bad_image"), (5, "empty"), (6, "bad_language"), (7, "duplicate"), (8, "bad_split"),
        (9, "bad_record"), (10, "split_conflict")]  # fmt: skip
    reasons = dict((line, reason) for line, _, reason in got)
    assert "'photos/missing.jpg' not found" in reasons[3]
    assert "'xyzzy' is not a language code (a BCP 47 tag such as es, pl, pt-BR or th), nor a language's name" in reasons[6]
    assert "as line 2" in reasons[7]
    assert "5 fields, the header has 4" in reasons[9]
    assert "in split train on line 2, here test" in reasons[10]
    assert set(result.rejects.column("source_file").to_pylist()) == {"captions.csv"}
    assert len(captions(result)) == 6
    with pytest.raises(TableError, match=r"captions.csv:3: image file 'photos/missing.jpg' not found .*data.strict=true"):
        read(tmp_path, strict=True)


def test_bom_crlf_quotes_and_newlines_inside_cells_are_read_as_written(tmp_path):
    images(tmp_path)
    text = ('file_name,caption,lang,split\r\n"photos/a.jpg","Un ""círculo"" rojo,\r\n a la izquierda",es,train\r\n'
            'photos/a.jpg,Czerwone koło.,pl,train\r\nphotos/b.jpg,Una estrella.,es,train\r\nphotos/b.jpg,Gwiazda.,pl,train\r\n')
    (tmp_path / "captions.csv").write_bytes(b"\xef\xbb\xbf" + text.encode())
    result = read(tmp_path)
    assert result.rejects.num_rows == 0
    t = result.captions.to_pydict()
    assert t["text"][t["line"].index(2)] == 'Un "círculo" rojo, a la izquierda'
    assert t["line"] == [2, 4, 5, 6]  # the quoted cell spans lines 2-3: the next row is line 4


def test_a_table_that_cannot_be_read_is_one_clear_error(tmp_path):
    images(tmp_path)
    latin = "file_name,caption,lang,split\nphotos/a.jpg,Un coraz\u00f3n.,es,train\nphotos/a.jpg,Serce.,pl,train\n"
    (tmp_path / "captions.csv").write_bytes(latin.encode("cp1252"))
    with pytest.raises(TableError, match=r"captions.csv:2: not utf-8 text \(byte 0xf3 at column 22\).*data.encoding"):
        read(tmp_path)
    assert "Un corazón." in [c[2] for c in captions(read(tmp_path, languages=("es",), encoding="cp1252"))]
    (tmp_path / "captions.csv").write_text('file_name,caption,lang\nphotos/a.jpg,"never closed,es\n', encoding="utf-8")
    with pytest.raises(TableError, match=r"captions.csv:2: malformed CSV"):
        read(tmp_path)
    (tmp_path / "captions.csv").unlink()
    (tmp_path / "captions.parquet").write_bytes(b"PAR1 not parquet")
    with pytest.raises(TableError, match=r"captions.parquet: not a readable Parquet file"):
        read(tmp_path)
    (tmp_path / "captions.parquet").unlink()
    with pytest.raises(TableError, match=r"no captions table: expected one of metadata.jsonl"):
        read(tmp_path)
    (tmp_path / "captions.jsonl").write_text('{"file_name": "photos/a.jpg", "caption": "Hola", "lang": "es"}\n[1]\n{oops\n')
    got = rejects(read(tmp_path, languages=("es",)))
    assert [(line, kind) for line, kind, _ in got] == [(2, "bad_record"), (3, "bad_record")]
    assert "a JSON list, not an object" in got[0][2] and "not valid JSON at column 2" in got[1][2]


@pytest.mark.parametrize("name", ["captions.csv", "captions.parquet"])
def test_a_language_s_name_or_a_region_tag_is_read_as_its_code_and_said(tmp_path, name, caplog):
    """`lang` columns as people fill them: English, German (any case, in English or in the
    language itself), en-US where data.languages has en (the region left out), each said
    once with its count; a value that names no language (a number in Parquet) is a reject."""
    images(tmp_path)
    rows = [("photos/a.jpg", "A red circle.", "English", "train"), ("photos/a.jpg", "Ein roter Kreis.", "German", "train"),
            ("photos/b.jpg", "A blue star.", "en-US", "train"), ("photos/b.jpg", "Ein blauer Stern.", "Deutsch", "train"),
            ("photos/c.jpg", "A green heart.", "english", "val"), ("photos/c.jpg", "Ein grünes Herz.", "de-AT", "val"),
            ("photos/d.jpg", "Two crosses.", "xyzzy", "test"), ("photos/d.jpg", "Zwei Kreuze.", "de", "test")]  # fmt: skip
    write_long(tmp_path / name, rows)
    result = read(tmp_path, languages=("en", "de"))
    assert [(c[0], c[1]) for c in captions(result)] == [("photos/a.jpg", "de"), ("photos/a.jpg", "en"),
        ("photos/b.jpg", "de"), ("photos/b.jpg", "en"), ("photos/c.jpg", "de"), ("photos/c.jpg", "en"),
        ("photos/d.jpg", "de")]  # fmt: skip
    assert [(line, kind) for line, kind, _ in rejects(result)] == [(8 if name.endswith(".csv") else 7, "bad_language")]
    said = [r.getMessage() for r in caplog.records if "read as" in r.getMessage()]
    assert f"{name}: 1 caption with lang 'English' read as en (its name)" in said
    assert f"{name}: 1 caption with lang 'en-US' read as en (data.languages has en without en-US's subtags)" in said
    assert f"{name}: 1 caption with lang 'Deutsch' read as de (its name)" in said and len(said) == 6


def test_a_region_or_script_in_a_language_s_name_is_kept(tmp_path):
    """CLDR's names with a region or script in brackets keep it: Brazilian rows train as
    pt-BR beside pt; a variety in another script than the language data.languages has
    (Traditional Chinese where it has zh) is a reject saying so, never read as zh."""
    images(tmp_path)
    rows = [("photos/a.jpg", "Um círculo vermelho.", "Portuguese (Brazil)", "train"),
            ("photos/a.jpg", "Um círculo encarnado.", "pt", "train"),
            ("photos/b.jpg", "Uma estrela azul.", "Portuguese (Portugal)", "train"),
            ("photos/b.jpg", "一顆藍色的星星。", "Chinese (Traditional)", "train"),
            ("photos/c.jpg", "一颗蓝色的星星。", "Chinese (Simplified)", "val")]  # fmt: skip
    write_long(tmp_path / "captions.csv", rows)
    result = read(tmp_path, languages=("pt", "pt-BR", "zh"))
    assert [(c[0], c[1]) for c in captions(result)] == [("photos/a.jpg", "pt"), ("photos/a.jpg", "pt-BR"),
        ("photos/b.jpg", "pt"), ("photos/c.jpg", "zh")]  # fmt: skip
    (line, kind, reason), = rejects(result)
    assert (line, kind) == (5, "bad_language")
    assert "zh is written in another script (Hans, zh-Hant in Hant): add zh-Hant to data.languages" in reason


def test_a_lang_column_that_names_no_language_keeps_its_rejects_and_says_where_they_are(tmp_path):
    """Integers in a Parquet lang column: every row is a reject with its reason, and the
    error that no en caption is left points at them instead of only at data.languages."""
    images(tmp_path)
    write_long(tmp_path / "captions.parquet", [("photos/a.jpg", "A red circle.", 1, "train"),
                                              ("photos/b.jpg", "A blue star.", 2, "train")])  # fmt: skip
    with pytest.raises(TableError, match=r"no usable en captions in the table \(its languages: none; 2 rejected for "
                                         r"a lang that names no language: `mule catalog --rejects` lists them\)") as error:  # fmt: skip
        read(tmp_path, languages=("en",))
    reasons = error.value.rejects.column("reason").to_pylist()
    assert reasons == ["column 'lang': 1 is a number, not a language code (a BCP 47 tag such as es, pl or pt-BR, or a "
                       "language's name)", reasons[0].replace("1", "2")]  # fmt: skip


def test_languages_outside_data_languages_are_left_out_and_said(tmp_path):
    images(tmp_path)
    write_long(tmp_path / "captions.csv", [*ROWS, ("photos/a.jpg", "วงกลมสีแดง", "th", "train")])
    result = read(tmp_path)
    assert result.notes["left_out_languages"] == {"th": 1}
    with pytest.raises(TableError, match=r"no usable de captions in the table \(its languages: es, pl, th\)"):
        read(tmp_path, languages=("es", "de"))


def test_unicode_line_separators_inside_captions_keep_the_line_numbers(tmp_path):
    # U+2028 and NEL are no line ends for CSV or JSON Lines; they would shift str.splitlines' count
    images(tmp_path)
    (tmp_path / "captions.csv").write_text("file_name,caption,lang\nphotos/a.jpg,Un\u2028círculo\x85rojo.,es\n"
                                           "photos/b.jpg,,es\n", encoding="utf-8")  # fmt: skip
    result = read(tmp_path, languages=("es",))
    assert [(line, kind) for line, kind, _ in rejects(result)] == [(3, "empty")]
    assert result.rejects.column("raw").to_pylist() == ["photos/b.jpg,,es"]
    assert result.captions.column("text").to_pylist() == ["Un círculo rojo."]  # a line break in a cell is a space
    (tmp_path / "captions.csv").unlink()
    (tmp_path / "captions.jsonl").write_text('{"file_name": "photos/a.jpg", "caption": "Un\u2028círculo.", "lang": "es"}\n'
                                             '{"file_name": "photos/b.jpg", "caption": "", "lang": "es"}\n', encoding="utf-8")  # fmt: skip
    result = read(tmp_path, languages=("es",))
    assert [(line, kind) for line, kind, _ in rejects(result)] == [(2, "empty")]


def test_a_long_table_s_caption_id_column_is_no_indonesian_caption(tmp_path):
    images(tmp_path)
    rows = [(i, t, lang, s, f"c{n}", "x") for n, (i, t, lang, s) in enumerate(ROWS)]
    write_long(tmp_path / "captions.csv", rows, ("file_name", "caption", "lang", "split", "caption_id", "text_xyz"))
    result = read(tmp_path)
    assert captions(result) == EXPECTED
    assert result.notes["table"]["form"] == "long" and result.notes["table"]["ignored"] == ["caption_id", "text_xyz"]


def test_a_list_of_captions_in_one_jsonl_cell_is_one_caption_each(tmp_path):
    # {"file_name": ..., "captions": [...]}: the way many image-text sets are published
    images(tmp_path)
    records = [{"file_name": "photos/a.jpg", "captions": ["Un círculo.", "Un disco rojo.", ""], "lang": "es"},
               {"file_name": "photos/b.jpg", "captions": ["Una estrella."], "lang": "es"}]  # fmt: skip
    (tmp_path / "metadata.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    result = read(tmp_path, languages=("es",))
    t = result.captions.to_pydict()
    assert t["text"] == ["Un círculo.", "Un disco rojo.", "Una estrella."]
    assert t["caption_id"] == ["metadata.jsonl:1:0", "metadata.jsonl:1:1", "metadata.jsonl:2:0"]
    assert rejects(result) == [(1, "empty", "column 'captions' item 2: empty caption")]


def test_a_path_that_leads_outside_the_dataset_is_a_reject_and_links_inside_it_are_followed(tmp_path):
    """A row naming `../outside/x.jpg` as a test image and the same file by its absolute
    path as a train image once put one photo in two splits (test leaking into training),
    and mule serve served any readable image of the host. Only files under the table's
    folder or the images folder are read; a link placed inside them is followed."""
    data = tmp_path / "data"
    images(data)
    outside = tmp_path / "outside"
    images(outside, ("x",))
    (data / "linked").symlink_to(outside / "photos", target_is_directory=True)  # put there by the dataset's owner
    rows = [*ROWS,
            ("../outside/photos/x.jpg", "Una cruz.", "es", "test"),
            (str(outside / "photos" / "x.jpg"), "Una cruz.", "es", "train"),
            ("photos/../../outside/photos/x.jpg", "Una cruz negra.", "es", "train"),
            (str(data / "photos" / "a.jpg"), "Un círculo.", "es", "train"),  # absolute, inside: photos/a.jpg
            ("linked/x.jpg", "Una cruz roja.", "es", "train"),
            ("linked/x.jpg", "Czerwony krzyż.", "pl", "train")]  # fmt: skip
    write_long(data / "captions.csv", rows)
    result = read(data)
    assert [(line, kind) for line, kind, _ in rejects(result)] == [(10, "outside_dataset"), (11, "outside_dataset"),
                                                                   (12, "outside_dataset")]  # fmt: skip
    assert "'../outside/photos/x.jpg' leads outside the dataset" in rejects(result)[0][2]
    ids = result.images.column("image_id").to_pylist()
    assert sorted(ids) == ["linked/x.jpg", *[f"photos/{n}.jpg" for n in "abcd"]]
    assert all(str(tmp_path / "outside") not in p for p in result.images.column("path").to_pylist())
    assert ("photos/a.jpg", "es", "Un círculo.", "train") in captions(result)
    with pytest.raises(TableError, match="must be inside the dataset folder"):
        read(data, table="../outside/captions.csv")


def test_the_ingest_key_covers_every_file_the_reader_read_links_included(tmp_path):
    from mule.config.resolution import resolve
    from mule.data_catalog.tables import Catalog
    from mule.pipeline.decisions import entry_digest
    from mule.storage.content_digests import FileHasher
    from mule.storage.workdir import Workdir

    data = tmp_path / "data"
    images(data)
    images(tmp_path / "outside", ("x",))
    (data / "linked").symlink_to(tmp_path / "outside" / "photos", target_is_directory=True)
    write_long(data / "captions.csv", [*ROWS, ("linked/x.jpg", "Una cruz.", "es", "train")])
    wd = Workdir.at(tmp_path / "work")
    cfg = resolve(None, {"data.dataset": "mine", "data.source": str(data), "data.languages": "es,pl"})
    read_paths = {p for p in read(data).images.column("path").to_pylist()}
    assert str(data / "linked" / "x.jpg") in read_paths

    def key() -> str:
        return entry_digest("raw files", wd, Catalog(wd), cfg, FileHasher(wd))

    before = key()
    Image.new("RGB", (8, 6), (1, 2, 3)).save(tmp_path / "outside" / "photos" / "x.jpg")  # edited behind the link
    assert key() != before


@pytest.mark.parametrize("delimiter", [";", "\t", "|"])
def test_the_delimiter_is_found_whatever_the_suffix(tmp_path, delimiter):
    """A spreadsheet in much of Europe writes `;`-separated .csv files; tabs and bars are
    as common. The header's known column names and every sampled row's cell count find it."""
    images(tmp_path)
    rows = [*ROWS, ("photos/a.jpg", "Un círculo; rojo, grande.", "es", "train")]  # the others inside a cell
    with open(tmp_path / "captions.csv", "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f, delimiter=delimiter)
        w.writerow(("file_name", "caption", "lang", "split"))
        w.writerows(rows)
    said = []
    result = read_table(tmp_path, "mine", tmp_path / "images", False, said.append, ReadOptions(("es", "pl")),
                        TableOptions())  # fmt: skip
    assert captions(result) == sorted((i, lang, t, s) for i, t, lang, s in rows)
    assert result.notes["table"]["delimiter"] == delimiter
    assert "cells separated by " + {";": "semicolons", "\t": "tabs", "|": "bars"}[delimiter] in said[0]


def test_a_comma_table_whose_captions_hold_semicolons_stays_a_comma_table(tmp_path):
    images(tmp_path)
    rows = [(i, f"{t}; {t}", lang, s) for i, t, lang, s in ROWS]
    write_long(tmp_path / "captions.csv", rows)
    result = read(tmp_path)
    assert result.notes["table"]["delimiter"] == "," and len(captions(result)) == len(rows)


def test_an_over_long_cell_is_a_rejected_row_and_the_rows_after_it_are_read(tmp_path):
    """One caption of 2 MB (past what the reader keeps of a cell) and one of 5,000 bytes
    (past data.max_caption_bytes): rejected rows with their lines, not an aborted ingest;
    the quoted cell's own line breaks do not shift the lines after it."""
    images(tmp_path)
    huge = '"' + ("Largo, largo\n" * 170_000) + '"'  # 2.2 MB over 170,000 lines, quoted
    lines = ["file_name,caption,lang,split", "photos/a.jpg,Un círculo.,es,train",
             f"photos/b.jpg,{huge},es,train", "photos/b.jpg,Una estrella.,es,train",
             f"photos/c.jpg,{'Largo ' * 1000},es,val", "photos/d.jpg,Una cruz.,es,test"]  # fmt: skip
    (tmp_path / "captions.csv").write_text("\n".join(lines) + "\n", encoding="utf-8")
    result = read(tmp_path, languages=("es",))
    got = rejects(result)
    assert [(line, kind) for line, kind, _ in got] == [(3, "too_long"), (170_005, "too_long")]
    assert "a cell of more than 1,048,576 characters" in got[0][2]
    assert "caption of 6000 bytes (data.max_caption_bytes=2000)" in got[1][2]
    t = result.captions.to_pydict()
    assert list(zip(t["line"], t["text"])) == [(2, "Un círculo."), (170_004, "Una estrella."), (170_006, "Una cruz.")]
    assert len(result.rejects.column("raw_bytes")[0].as_py()) <= 4096  # what is kept of the row, for a look


@pytest.mark.slow
def test_a_table_is_read_as_it_comes_not_held_whole(tmp_path, monkeypatch):
    """Python's allocations while reading a 20,000-row table stay under twice its size (the
    captions go to disk in batches, 2,000 here and 10,000 by default, and seen captions are
    16 bytes each); the table used to be held as bytes, a string, two copies and a list of
    lines, about 15 times its size. bench/table_ingest.py measures a million rows."""
    import tracemalloc

    from mule.datasets.readers import base

    monkeypatch.setattr(base, "SPOOL_ROWS", 2_000)
    images(tmp_path, [f"p{i:03d}" for i in range(100)])
    rows = [(f"photos/p{n % 100:03d}.jpg", f"Una foto número {n} de un perro que corre por el parque.", "es", "train")
            for n in range(20_000)]  # fmt: skip
    write_long(tmp_path / "captions.csv", rows)
    size = (tmp_path / "captions.csv").stat().st_size
    tracemalloc.start()
    try:
        result = read(tmp_path, languages=("es",))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert result.captions.num_rows == 20_000
    assert peak < 2 * size, f"{peak / 2**20:.1f} MB of allocations for a {size / 2**20:.1f} MB table"


@pytest.mark.parametrize("line", [101, 39_901], ids=["over 1 MiB after it", "under 1 MiB after it"])
@pytest.mark.slow
def test_a_quote_left_open_in_a_40000_row_table_is_the_error_naming_its_line(tmp_path, line):
    """A caption that opens a quote it never closes ('"Big sale: a red shoe ...') in a
    40,000-row table of 12 MB: one error naming its line, whether more or less than 1 MiB of
    the file follows (past the cell limit the reader used to skip the rest of the file as
    one over-long cell, keep the rows before it and go on, holding the rest in memory);
    memory stays bounded by the cell limit, not the file."""
    import tracemalloc

    images(tmp_path, [f"p{i:03d}" for i in range(100)])
    filler = "y" * 250
    rows = [(f"photos/p{n % 100:03d}.jpg", f"A dog {n} runs in the park {filler}.", "en", "train") for n in range(40_000)]
    write_long(tmp_path / "captions.csv", rows)
    lines = (tmp_path / "captions.csv").read_text(encoding="utf-8").splitlines()
    lines[line - 1] = f'photos/p000.jpg,"Big sale: a red shoe for every dog {filler},en,train'
    (tmp_path / "captions.csv").write_text("\n".join(lines) + "\n", encoding="utf-8")
    size = (tmp_path / "captions.csv").stat().st_size
    assert size > 10 * 2**20 and ((len(lines) - line) * len(lines[-1]) < 2**20) == (line != 101)
    tracemalloc.start()
    try:
        with pytest.raises(TableError) as raised:
            read(tmp_path, languages=("en",))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    message = str(raised.value)
    assert f"captions.csv:{line}: malformed CSV" in message and "a quoted cell must end with a quote" in message, message
    if line == 101:  # 100 rows read, then a cell cut at its limit (csv holds 4 bytes a character): not the file
        assert peak < size, f"{peak / 2**20:.1f} MB of allocations for a {size / 2**20:.1f} MB table"


def test_a_long_quoted_cell_that_closes_is_one_reject_naming_the_lines_it_spans(tmp_path):
    """Past the cell limit, a quoted cell that does close is one too_long row: its reason says
    which lines it took, so a second stray quote far below the first shows what it swallowed."""
    images(tmp_path)
    huge = '"' + ("Largo, largo\n" * 100_000) + '"'
    lines = ["file_name,caption,lang,split", f"photos/b.jpg,{huge},es,train", "photos/a.jpg,Un círculo.,es,train"]
    (tmp_path / "captions.csv").write_text("\n".join(lines) + "\n", encoding="utf-8")
    result = read(tmp_path, languages=("es",))
    assert rejects(result) == [(2, "too_long", "a cell of more than 1,048,576 characters over lines 2-100,002: no "
                                               "caption is that long (the row is skipped)")]  # fmt: skip
    assert result.captions.to_pydict()["line"] == [100_003]
