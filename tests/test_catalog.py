"""The catalog: Parquet tables behind DuckDB views, atomic writes, feature parts."""

import numpy as np
import pyarrow as pa
import pytest

import mule.data_catalog.tables as catalog_module
from mule.data_catalog.schemas import REJECTS
from mule.data_catalog.table_access import CatalogError
from mule.data_catalog.tables import Catalog
from mule.storage.workdir import Workdir


def rejects(n: int, dataset: str = "d") -> pa.Table:
    return pa.table(
        {"dataset": [dataset] * n, "source_file": ["f.gz"] * n, "line": list(range(1, n + 1)),
         "kind": ["empty"] * n, "reason": ["empty caption"] * n, "raw": [""] * n, "raw_bytes": [b""] * n},
        schema=REJECTS,
    )  # fmt: skip


def test_tables_are_queryable_through_duckdb_views(tmp_path):
    catalog = Catalog(Workdir.at(tmp_path))
    catalog.write_table("rejects", "a", rejects(2, "a"))
    catalog.write_table("rejects", "b", rejects(3, "b"))
    counts = catalog.query("SELECT dataset, count(*) AS n FROM rejects GROUP BY dataset ORDER BY dataset").to_pylist()
    assert counts == [{"dataset": "a", "n": 2}, {"dataset": "b", "n": 3}]
    assert (tmp_path / "catalog.duckdb").exists()


@pytest.mark.slow
def test_two_threads_refresh_the_views_without_a_conflict_or_a_false_damage(tmp_path, caplog):
    """Two threads of one process (a Dask worker's, a server's) refreshing catalog.duckdb at
    once, 50 times each: no DuckDB "Catalog write-write conflict", and no warning that a
    view left out a damaged file when none is damaged (2-3 in 60 refreshes did both, the
    warning naming no file)."""
    import threading

    catalog = Catalog(Workdir.at(tmp_path))
    for dataset in ("a", "b", "c"):
        catalog.write_table("rejects", dataset, rejects(3, dataset))
    errors = []

    def refresh() -> None:
        for _ in range(50):
            try:
                Catalog(Workdir.at(tmp_path)).refresh_views()
            except Exception as error:  # noqa: BLE001 - what the test counts
                errors.append(repr(error))

    with caplog.at_level("WARNING", logger="mule.catalog"):
        lanes = [threading.Thread(target=refresh) for _ in range(2)]
        for lane in lanes:
            lane.start()
        for lane in lanes:
            lane.join(120)
    assert errors == [] and [r.getMessage() for r in caplog.records] == []
    assert catalog.query("SELECT count(*) AS n FROM rejects")["n"][0].as_py() == 9


def test_queries_from_threads_and_a_forked_child_each_see_their_own_views(tmp_path):
    """Queries share one in-memory DuckDB per process: each on a connection of its own,
    a forked child on its own database (the parent's threads do not exist there: a child
    that inherited it hung at exit)."""
    import subprocess
    import sys
    from concurrent.futures import ThreadPoolExecutor

    catalog = Catalog(Workdir.at(tmp_path))
    catalog.write_table("rejects", "a", rejects(2, "a"))
    with ThreadPoolExecutor(4) as pool:
        counts = list(pool.map(lambda _: catalog.query("SELECT count(*) AS n FROM rejects")["n"][0].as_py(), range(40)))
    assert counts == [2] * 40
    child = f"""
import os, sys
from mule.data_catalog.tables import Catalog
from mule.storage.workdir import Workdir
catalog = Catalog(Workdir.at({str(tmp_path)!r}))
assert catalog.query("SELECT count(*) AS n FROM rejects")["n"][0].as_py() == 2
pid = os.fork()
if pid == 0:
    assert catalog.query("SELECT count(*) AS n FROM rejects")["n"][0].as_py() == 2
    sys.exit(0)  # the interpreter's own exit, not os._exit
_, status = os.waitpid(pid, 0)
assert catalog.query("SELECT count(*) AS n FROM rejects")["n"][0].as_py() == 2
sys.exit(os.waitstatus_to_exitcode(status))
"""
    done = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr


def test_a_crash_while_writing_leaves_the_old_table(tmp_path, monkeypatch):
    catalog = Catalog(Workdir.at(tmp_path))
    catalog.write_table("rejects", "a", rejects(2))

    def crash(table, path, **kwargs):
        path.write_bytes(b"half a parquet file")
        raise OSError("disk full")

    monkeypatch.setattr(catalog_module.pq, "write_table", crash)
    with pytest.raises(OSError, match="disk full"):
        catalog.write_table("rejects", "a", rejects(5))
    monkeypatch.undo()
    assert catalog.read_table("rejects", "a").num_rows == 2
    assert sorted(p.name for p in (tmp_path / "catalog" / "rejects").iterdir()) == ["a.parquet"]


def test_missing_tables_say_which_stage_to_run(tmp_path):
    import mule.pipeline.decisions  # noqa: F401 - registers the stage that writes each table (from the declarations)

    catalog = Catalog(Workdir.at(tmp_path))
    with pytest.raises(CatalogError, match=r"no captions table for dataset 'nope' yet: run the ingest stage first"):
        catalog.read_table("captions", "nope")
    catalog.write_table("rejects", "a", rejects(1))
    with pytest.raises(CatalogError) as raised:
        catalog.query("SELECT w.token FROM rejects r JOIN word_vectors w ON r.dataset = w.dataset")
    message = str(raised.value)
    assert message == (
        f"the catalog in {tmp_path.resolve()} has no word_vectors table yet: run the text stage first (mule run text)"
    )
    assert "Did you mean" not in message  # DuckDB's guess (here: "rejects") would only mislead
    with pytest.raises(CatalogError, match=r"no features table yet: run the features stage first"):
        catalog.query("SELECT * FROM features")


def test_a_moved_workdir_points_its_image_paths_and_views_at_itself(tmp_path):
    import shutil

    from mule.data_catalog.schemas import IMAGES

    old = Workdir.at(tmp_path / "old")
    images = pa.table(
        {"dataset": ["d", "d"], "image_id": ["1.jpg", "2.jpg"], "file_name": ["1.jpg", "2.jpg"],
         "path": [str(old.root / "raw/d/images/1.jpg"), "/elsewhere/images/2.jpg"], "split": ["train"] * 2,
         "role": ["train"] * 2, "exists": [True, True], "sha256": ["a", "b"], "width": [1, 1], "height": [1, 1]},
        schema=IMAGES,
    )  # fmt: skip
    Catalog(old).write_table("images", "d", images)
    shutil.copytree(old.root, tmp_path / "new")
    new = Workdir.at(tmp_path / "new")
    catalog = Catalog(new)
    assert list(catalog.relocate(old.root)) == [new.root / "catalog" / "images" / "d.parquet"]  # one table rewritten
    paths = catalog.query("SELECT path FROM images ORDER BY image_id")["path"].to_pylist()
    assert paths == [str(new.root / "raw/d/images/1.jpg"), "/elsewhere/images/2.jpg"]  # a user's folder stays
    (old.root / "catalog" / "images" / "d.parquet").unlink()  # the copy no longer reads the original
    assert catalog.query("SELECT count(*) AS n FROM images")["n"][0].as_py() == 2


def test_feature_parts_resume_and_read_back_in_order(tmp_path):
    catalog = Catalog(Workdir.at(tmp_path))
    catalog.write_feature_part("d", "x1", ["i1", "i2"], np.array([[1, 2], [3, 4]], np.float32))
    assert catalog.extracted_image_ids("d", "x1") == {"i1", "i2"}
    catalog.write_feature_part("d", "x1", ["i3"], np.array([[5, 6]], np.float32))
    assert [p.name for p in catalog.feature_parts("d", "x1")] == ["part-00000.parquet", "part-00001.parquet"]
    assert catalog.read_features("d", "x1", ["i3", "i1"]).tolist() == [[5, 6], [1, 2]]
    with pytest.raises(CatalogError, match="first: i9"):
        catalog.read_features("d", "x1", ["i1", "i9"])
    catalog.refresh_views()
    assert catalog.query("SELECT count(*) AS n FROM features WHERE extractor = 'x1'")["n"][0].as_py() == 3


def test_a_split_name_reads_that_split_alone_and_a_role_reads_its_splits(tmp_path):
    """A table with splits `test` and `test_shoes` (both in the test role): evaluating `test`
    reads `test` alone, `tests` each of the two; Multi30K's `test` (no split of that
    name) reads its role, test_2016."""
    from mule.data_catalog import queries
    from mule.data_catalog.schemas import CAPTIONS, IMAGES

    catalog = Catalog(Workdir.at(tmp_path))
    splits = {"shop": [("a", "train", "train"), ("b", "test", "test"), ("c", "test_shoes", "test")],
              "m30k": [("x", "train", "train"), ("y", "test_2016", "test")]}  # fmt: skip
    for dataset, rows in splits.items():
        n = len(rows)
        catalog.write_table("images", dataset, pa.table({
            "dataset": [dataset] * n, "image_id": [r[0] for r in rows], "file_name": [r[0] for r in rows],
            "path": [r[0] for r in rows], "split": [r[1] for r in rows], "role": [r[2] for r in rows],
            "exists": [True] * n, "sha256": [r[0] for r in rows], "width": [1] * n, "height": [1] * n}, schema=IMAGES))  # fmt: skip
        catalog.write_table("captions", dataset, pa.table({
            "caption_id": [f"{r[0]}1" for r in rows], "dataset": [dataset] * n, "image_id": [r[0] for r in rows],
            "split": [r[1] for r in rows], "role": [r[2] for r in rows], "lang": ["en"] * n,
            "text": ["a dog"] * n, "tokens": [["a", "dog"]] * n, "source": ["table"] * n, "source_file": ["t"] * n,
            "line": list(range(n)), "origin_caption_id": [None] * n, "also_in": [None] * n,
            "source_version": [None] * n}, schema=CAPTIONS))  # fmt: skip

    def images(dataset: str, selector: str) -> list[str]:
        return queries.caption_selection(catalog, dataset, selector, ["en"], "human")["image_id"].to_pylist()

    assert images("shop", "test") == ["b"]
    assert images("shop", "test_shoes") == ["c"]
    assert queries.evaluation_splits(catalog, "shop", "test") == [("test", "test")]
    assert queries.evaluation_splits(catalog, "shop", "tests") == [("test", "test"), ("test_shoes", "test_shoes")]
    assert images("m30k", "test") == ["y"]  # the role, named by its one split
    assert queries.evaluation_splits(catalog, "m30k", "test") == [("test", "test_2016")]
    assert [r["image_id"] for r in queries.human_captions_to_translate(catalog, "shop", ["test"])] == ["b"]
    assert images("shop", "all") == ["a", "b", "c"]


def test_a_write_is_synced_before_and_after_its_rename(tmp_path, monkeypatch):
    """A power cut after a write's rename must not leave an empty record: the temporary
    file's bytes reach the disk before it takes the name, and the folder's entry after."""
    import os

    from mule.storage import atomic

    order = []
    real_fsync, real_replace = os.fsync, os.replace
    monkeypatch.setattr(os, "fsync", lambda fd: order.append(("fsync", os.readlink(f"/proc/self/fd/{fd}")))
                        or real_fsync(fd))  # fmt: skip
    monkeypatch.setattr(os, "replace", lambda a, b: order.append(("rename", str(b))) or real_replace(a, b))
    path = tmp_path / "state" / "record.json"
    atomic.write_json_atomic({"key": 1}, path)
    assert [kind for kind, _ in order] == ["fsync", "rename", "fsync"]
    assert ".record.json.tmp-" in order[0][1] and order[2][1] == str(path.parent)
    assert path.read_text().strip().startswith("{")


def test_another_machine_s_temporary_is_left_to_its_writer_and_this_one_s_dead_ones_are_removed(tmp_path):
    """On a shared file system a Dask worker elsewhere writes its feature part beside ours:
    its PID means nothing here, so its temporary is kept (until a day old), while a dead
    writer's of this machine is removed by the next write."""
    import os
    import subprocess
    import sys
    import time

    from mule.storage import atomic

    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True).stdout.strip()  # fmt: skip
    host = atomic._host()
    mine_dead = tmp_path / f".part-1.parquet.tmp-{host}-{dead}"
    legacy_dead = tmp_path / f".part-2.parquet.tmp-{dead}"
    mine_alive = tmp_path / f".part-3.parquet.tmp-{host}-{os.getppid()}"
    theirs = tmp_path / f".part-4.parquet.tmp-worker_7-{dead}"
    theirs_old = tmp_path / f".part-5.parquet.tmp-worker_7-{dead}"
    for path in (mine_dead, legacy_dead, mine_alive, theirs, theirs_old):
        path.write_bytes(b"half")
    day_ago = time.time() - atomic.FOREIGN_STALE_S - 60
    os.utime(theirs_old, (day_ago, day_ago))
    atomic.write_json_atomic({"k": 1}, tmp_path / "x.json")
    left = sorted(p.name for p in tmp_path.iterdir())
    assert left == sorted([mine_alive.name, theirs.name, "x.json"])


def test_a_stage_s_catalog_reaches_only_the_entries_it_declares(tmp_path):
    """What a stage's computation is handed (data_catalog.declared): its declared entries'
    tables, by query or by name; any other is an error naming the stage and the entry."""
    import pyarrow as pa

    from mule.data_catalog.declared import DeclaredCatalog, UndeclaredEntryError, table_entry
    from mule.data_catalog.schemas import TABLES

    wd = Workdir.at(tmp_path / "w")
    catalog = Catalog(wd)
    catalog.write_table("rejects", "d", pa.Table.from_pylist([], schema=TABLES["rejects"]))
    seen = DeclaredCatalog(catalog, "evaluate", {"rejects", "images"})
    assert seen.read_table("rejects", "d").num_rows == 0 and seen.query("SELECT count(*) AS n FROM rejects")
    with pytest.raises(UndeclaredEntryError, match="stage evaluate reached the catalog entry 'word vectors'"):
        seen.query("SELECT word FROM word_vectors")
    with pytest.raises(UndeclaredEntryError, match="'features'"):
        seen.feature_parts("d", "x")
    with pytest.raises(UndeclaredEntryError, match="'mt captions'"):
        seen.write_table("captions", "d.mt", pa.table({}))
    assert table_entry("rejects", "d.images") == "image rejects" and seen.has_table("rejects", "d")


def test_a_dataset_s_languages_are_the_ones_its_captions_use(tmp_path):
    """Read from the lang column's dictionary (no pyarrow.compute): a dictionary entry no
    row uses, and a null, are not languages; machine-translated captions add theirs."""
    import pyarrow.parquet as pq

    wd = Workdir.at(tmp_path)
    human = wd.table_path("captions", "d")
    human.parent.mkdir(parents=True)
    lang = pa.DictionaryArray.from_arrays(pa.array([1, 1, None, 2], pa.int32()), pa.array(["fr", "en", "de"]))
    pq.write_table(pa.table({"lang": lang}), human, row_group_size=2)  # two row groups: two dictionaries
    pq.write_table(pa.table({"lang": ["cs", "en"]}), wd.table_path("captions", "d.mt"))
    assert Catalog(wd, read_only=True).languages("d") == ["cs", "de", "en"]
