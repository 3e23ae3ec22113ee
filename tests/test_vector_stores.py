"""The stores `mule embed` writes (serving/vector_stores.py), on their own: every batch keeps
its rejects, a rerun reads back exactly what was written, and resuming reads only ids."""

import os

import numpy as np
import pyarrow.parquet as pq
import pytest

from mule.mule_core.errors import InputError
from mule.serving.batch_embed import content_id, read_sentences
from mule.serving.vector_stores import Maker, NotAStoreError, open_store

MAKER = Maker("identity-1", "a model", "images", 4)


def unit(n: int) -> np.ndarray:
    vectors = np.random.default_rng(n).normal(size=(n, 4)).astype(np.float32)
    return vectors / np.linalg.norm(vectors, axis=1, keepdims=True)


def test_parquet_batches_of_rejects_alone_never_write_over_each_other(tmp_path):
    """Two batches of corrupt files only (no vectors), then one of both: three batches, three
    numbers; the store holds every reject, and a rerun knows all of them (it redoes none).
    Reject files were numbered by the vector parts, so the second batch overwrote the first."""
    store = open_store("parquet", tmp_path, MAKER)
    store.write([], np.zeros((0, 4), np.float32), {}, [(f"bad-{i}.jpg", "not an image") for i in range(64)])
    store.write([], np.zeros((0, 4), np.float32), {}, [(f"bad-{i}.jpg", "not an image") for i in range(64, 70)])
    store.write(["a.jpg", "b.jpg"], unit(2), {}, [("bad-70.jpg", "truncated")])
    assert sorted(p.name for p in tmp_path.glob("*.parquet")) == [
        "part-00002.parquet", "rejects-00000.parquet", "rejects-00001.parquet", "rejects-00002.parquet"]  # fmt: skip
    rejected = [i for p in sorted(tmp_path.glob("rejects-*.parquet")) for i in pq.read_table(p).column("id").to_pylist()]
    assert sorted(rejected) == sorted(f"bad-{i}.jpg" for i in range(71))
    store.close()
    again = open_store("parquet", tmp_path, MAKER)
    assert again.done == {*rejected, "a.jpg", "b.jpg"}
    again.write(["c.jpg"], unit(1), {}, [])
    assert (tmp_path / "part-00003.parquet").exists()  # after the store's last batch, whatever it held
    again.close()


def test_a_lancedb_store_resumes_reading_its_ids_alone(tmp_path, monkeypatch):
    """Reopened, a LanceDB store learns which ids it holds without reading its vectors: a
    table read whole (to_arrow) is refused here."""
    pytest.importorskip("lancedb")
    from lancedb.table import LanceTable

    store = open_store("lancedb", tmp_path / "vectors.lance", MAKER)
    store.write([f"{i}.jpg" for i in range(300)], unit(300), {}, [("bad.jpg", "not an image")])
    store.close()

    def whole(self, *args, **kwargs):
        raise AssertionError("the table was read whole, vectors and all")

    monkeypatch.setattr(LanceTable, "to_arrow", whole)
    again = open_store("lancedb", tmp_path / "vectors.lance", MAKER)
    assert again.done == {f"{i}.jpg" for i in range(300)} | {"bad.jpg"}
    again.close()


def test_sentences_without_an_id_column_are_named_by_their_content(tmp_path):
    """Without an id column a row's id is a digest of its language and text: a row inserted
    at the top leaves every other row's id as it was (ids by row number moved them all, and
    the store then held other sentences' vectors under them); the same text in another
    language is another sentence."""
    table = tmp_path / "sentences.csv"
    table.write_text("text,lang\na red circle,en\nein blaues Quadrat,de\na red circle,\n", encoding="utf-8")
    before = read_sentences(table, lang="fr").column("id").to_pylist()
    assert before == [content_id("a red circle", "en"), content_id("ein blaues Quadrat", "de"),
                      content_id("a red circle", "fr")]  # fmt: skip
    assert len(set(before)) == 3
    table.write_text("text,lang\na new first row,en\na red circle,en\nein blaues Quadrat,de\na red circle,\n",
                     encoding="utf-8")  # fmt: skip
    assert read_sentences(table, lang="fr").column("id").to_pylist()[1:] == before


@pytest.mark.parametrize("suffix", [".csv", ".tsv"])
def test_sentence_ids_are_kept_as_written(tmp_path, suffix):
    """ids are text: 007, 7 and 0042 are three ids (a number type made 7 of the first two and
    dropped one as a repeat), and NA, N/A, null, nan are ids like any other, not missing
    values; a text that reads as a number or as NA stays as written too."""
    sep = "\t" if suffix == ".tsv" else ","
    ids = ["007", "7", "0042", "NA", "N/A", "null", "nan", "1e3", "TRUE"]
    rows = [sep.join((i, f"sentence {n}" if n % 2 else "NA", "en")) for n, i in enumerate(ids)]
    table = tmp_path / f"sentences{suffix}"
    table.write_text(sep.join(("id", "text", "lang")) + "\n" + "\n".join(rows) + "\n", encoding="utf-8")
    read = read_sentences(table)
    assert read.column("id").to_pylist() == ids and read.column("id").null_count == 0
    assert read.column("text").to_pylist()[:2] == ["NA", "sentence 1"]


def test_a_sentence_without_an_id_is_refused_naming_its_rows(tmp_path):
    table = tmp_path / "sentences.csv"
    table.write_text("id,text\n1,a dog\n,a cat\n3,a car\n  ,a bird\n", encoding="utf-8")
    with pytest.raises(InputError, match=r"sentences.csv: 2 rows without an id \(row 2, 4, counting"):
        read_sentences(table)
    jsonl = tmp_path / "sentences.jsonl"
    jsonl.write_text('{"id": "a", "text": "a dog"}\n{"id": null, "text": "a cat"}\n{"id": "7", "text": "x"}\n')
    with pytest.raises(InputError, match=r"1 row without an id \(row 2,"):
        read_sentences(jsonl)
    jsonl.write_text('{"id": 7, "text": "a dog"}\n{"id": 70, "text": "a cat"}\n')  # JSON's numbers, as text
    assert read_sentences(jsonl).column("id").to_pylist() == ["7", "70"]


@pytest.mark.parametrize("kind", ["parquet", "lancedb", "qdrant"])
def test_a_folder_of_the_user_s_or_a_file_is_never_written_into(tmp_path, kind):
    """--out holding a thesis is refused, the folder left as it was; a file too; an empty
    folder becomes a store, and that store opens again."""
    pytest.importorskip({"parquet": "pyarrow", "lancedb": "lancedb", "qdrant": "qdrant_client"}[kind])
    thesis = tmp_path / "thesis"
    thesis.mkdir()
    (thesis / "thesis.tex").write_text("\\chapter{MULE}\n")
    with pytest.raises(NotAStoreError, match=r"holds files that are not a .* store's \(thesis.tex\)"):
        open_store(kind, thesis, MAKER)
    assert sorted(p.name for p in thesis.iterdir()) == ["thesis.tex"]
    (tmp_path / "paper.pdf").write_bytes(b"%PDF")
    with pytest.raises(NotAStoreError, match="is a file"):
        open_store(kind, tmp_path / "paper.pdf", MAKER)
    (tmp_path / "store").mkdir()
    store = open_store(kind, tmp_path / "store", MAKER)
    store.write(["a.jpg"], unit(1), {}, [("b.jpg", "not an image")])
    store.close()
    again = open_store(kind, tmp_path / "store", MAKER)
    assert again.done == {"a.jpg", "b.jpg"}
    again.close()


SECOND_WRITER = """
import sys
from pathlib import Path
import numpy as np
from mule.commands import console
console.setup("embed", None)
from mule.serving.vector_stores import Maker, open_store
store = open_store("parquet", Path(sys.argv[1]), Maker("identity-1", "a model", "images", 4))
print("already", sorted(store.done), flush=True)
store.write(["c.jpg"], np.ones((1, 4), np.float32) / 2, {}, [])
store.close()
"""


@pytest.mark.slow
def test_a_second_writer_of_a_parquet_store_waits_and_numbers_its_parts_after_the_first_s(tmp_path):
    """Two `mule embed` into one Parquet store numbered their parts the same way (each from
    what was there when it opened): the second writer's part replaced the first's. The
    second now says it waits, and opens the store once the first closed it."""
    import subprocess
    import sys
    import time

    out = tmp_path / "vectors"
    first = open_store("parquet", out, MAKER)
    with open(tmp_path / "second.log", "w") as log:
        second = subprocess.Popen([sys.executable, "-c", SECOND_WRITER, str(out)], stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 60
    while "waiting" not in (tmp_path / "second.log").read_text() and time.monotonic() < deadline:
        time.sleep(0.1)
    first.write(["a.jpg", "b.jpg"], unit(2), {}, [])
    time.sleep(0.5)
    assert second.poll() is None  # still waiting
    first.close()
    assert second.wait(60) == 0
    said = (tmp_path / "second.log").read_text()
    # who holds it: this test's process, its command and since when
    assert f"{out} is being written by pid {os.getpid()} (`" in said and ": waiting for it to finish" in said
    assert "already ['a.jpg', 'b.jpg']" in said
    assert sorted(p.name for p in out.glob("part-*")) == ["part-00000.parquet", "part-00001.parquet"]
    ids = [i for p in sorted(out.glob("part-*")) for i in pq.read_table(p).column("id").to_pylist()]
    assert ids == ["a.jpg", "b.jpg", "c.jpg"]
