"""The catalog: Parquet tables in the workdir, DuckDB views over them.

Writes are atomic: a table is written next to its final name and renamed over it, so
a crash leaves either the old table or the new one, never half of one. Features are
written in parts, so an interrupted extraction resumes after the last complete part.
"""

from __future__ import annotations

import glob
import json
import logging
import re
import threading
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from mule.data_catalog.schemas import TABLES, features_schema
from mule.data_catalog.table_access import (
    MISSING_TABLE,
    CatalogError,
    damaged_table_error,
    distinct_strings,
    duckdb_readable,
    import_compute,
    import_duckdb,
    in_memory_connection,
    is_lock_conflict,
    missing_table_error,
    quoted,
    readable_parquet,
    write_parquet_atomic,
)
from mule.storage.atomic import atomic_path, write_atomic, write_json_atomic, write_text_atomic  # noqa: F401 - the catalog's writers
from mule.storage.workdir import Workdir

log = logging.getLogger("mule.catalog")
# One refresh of catalog.duckdb at a time in a process: two threads that each refresh it (a
# Dask worker's, a server's) conflict, and DuckDB refuses two connections replacing the same view at once
# ("Catalog write-write conflict").
_REFRESHING = threading.Lock()
VIEWS = ("images", "captions", "rejects", "word_vectors", "subword_vectors", "translations", "features")

class Catalog:
    """read_only: a reading command's catalog (mule serve, search, catalog): it writes
    nothing, catalog.duckdb included, and its writes are errors."""

    def __init__(self, workdir: Workdir, read_only: bool = False):
        self.workdir = workdir
        self.read_only = read_only

    def _committing(self) -> None:
        """Before a write readers see: they wait until this stage is recorded (storage.locks)."""
        if self.read_only:
            raise CatalogError(f"a reading command tried to write the catalog of {self.workdir.root}")
        from mule.storage.locks import committing, holds_lock

        if holds_lock(self.workdir):  # a run (tests and benches that run stages alone have no readers)
            committing(self.workdir)

    # -- views ----------------------------------------------------------------------
    def _globs(self) -> dict[str, str]:
        base = self.workdir.catalog_dir
        globs = {name: str(base / name / "*.parquet") for name in TABLES}
        globs["features"] = str(base / "features" / "*" / "*" / "*.parquet")
        return globs

    def refresh_views(self) -> None:
        """Refreshes catalog.duckdb, the views people query with `duckdb` (mule's own reads
        never open it: Catalog.query). Only a run holding the workdir's lock writes it. The
        views are derived from the Parquet files, so a file proven unreadable is rebuilt;
        one another process has open (a lock conflict) is left alone, and the next run
        refreshes it. A damaged Parquet file is left out of its view (the stage that wrote
        it runs again: pipeline.decisions checks outputs before reuse)."""
        if self.read_only:
            return
        with _REFRESHING:
            self._refresh_views()

    def _refresh_views(self) -> None:
        from mule.storage.locks import holds_lock

        path = self.workdir.duckdb_path
        try:
            con = import_duckdb().connect(str(path))
        except import_duckdb().Error as error:
            if is_lock_conflict(error):
                log.warning("catalog: %s is open in another process (%s); its views are refreshed by the next run",
                            path, str(error).splitlines()[0][:200])  # fmt: skip
                return
            if path.exists() and not duckdb_readable(path) and holds_lock(self.workdir):
                self._rebuild_database()  # proven unreadable, and no other mule process writes here
                con = import_duckdb().connect(str(path))
            else:
                log.warning("catalog: %s cannot be opened (%s); its views are refreshed by the next run", path,
                            str(error).splitlines()[0][:200])  # fmt: skip
                return
        with con:
            for name, pattern in self._globs().items():
                if not self._create_view(con, name, pattern):
                    con.execute(f"DROP VIEW IF EXISTS {name}")

    def _create_view(self, con, name: str, pattern: str, replace: str = "", temporary: bool = False) -> bool:
        """A view over the table's Parquet files: all of them, or the readable ones (a
        damaged file is left out, saying so); False when there are none it can read.
        `replace`: a REPLACE clause for its columns; `temporary`: the connection's own."""
        files = sorted(glob.glob(pattern))
        if not files:
            return False
        columns = f"* REPLACE ({replace})" if replace else "*"
        view = "TEMP VIEW" if temporary else "VIEW"
        try:
            con.execute(f"CREATE OR REPLACE {view} {name} AS SELECT {columns} FROM "
                        f"read_parquet('{quoted(pattern)}', union_by_name = true)")  # fmt: skip
            return True
        except import_duckdb().Error:
            readable = [f for f in files if readable_parquet(Path(f))]
            if len(readable) < len(files):  # else no file is damaged: named one by one, they are read
                log.warning("catalog: left out of the %s view, unreadable (damaged?): %s", name,
                            ", ".join(f for f in files if f not in readable))  # fmt: skip
            if not readable:
                return False
            listed = ", ".join(f"'{quoted(f)}'" for f in readable)
            con.execute(f"CREATE OR REPLACE {view} {name} AS SELECT {columns} FROM "
                        f"read_parquet([{listed}], union_by_name = true)")  # fmt: skip
            return True

    def _rebuild_database(self) -> None:
        log.warning("catalog: %s was unreadable; rebuilt from the Parquet tables", self.workdir.duckdb_path)
        for stale in (self.workdir.duckdb_path, self.workdir.duckdb_path.with_name("catalog.duckdb.wal")):
            stale.unlink(missing_ok=True)

    def _connect(self, sql: str):
        """A connection to this process's in-memory DuckDB with a TEMP view over the Parquet
        files of each table `sql` names. Never catalog.duckdb: a reader cannot collide with
        a run writing it, and never writes the workdir. In a workdir copied or moved since
        its last run, the images' paths inside it are read as they are now (the next run
        rewrites them for good)."""
        con = in_memory_connection()
        globs = self._globs()
        moved = self.workdir.moved_from()
        for name in VIEWS:
            if not re.search(rf"\b{name}\b", sql):
                continue
            replace = ""
            if name == "images" and moved is not None:
                old, new = str(moved).rstrip("/") + "/", str(self.workdir.root) + "/"
                replace = (f"CASE WHEN starts_with(path, '{quoted(old)}') THEN '{quoted(new)}' || "
                           f"substr(path, {len(old) + 1}) ELSE path END AS path")  # fmt: skip
            self._create_view(con, name, globs[name], replace, temporary=True)
        return con

    def query(self, sql: str, params: list | None = None) -> pa.Table:
        with self._connect(sql) as con:
            try:
                relation = con.sql(sql, params=params or None)
                # DuckDB 2 renamed arrow() to to_arrow_table().
                return relation.to_arrow_table() if hasattr(relation, "to_arrow_table") else relation.arrow()
            except import_duckdb().CatalogException as error:
                missing = MISSING_TABLE.search(str(error))
                if missing is None or missing.group(1) not in VIEWS:  # a typo in mule's SQL is a bug
                    raise
                raise missing_table_error(missing.group(1), self.workdir) from None

    # -- tables ---------------------------------------------------------------------
    def write_table(self, name: str, dataset: str, table: pa.Table) -> Path:
        schema = TABLES[name]
        table = table.select(schema.names).cast(schema)
        path = self.workdir.table_path(name, dataset)
        self._committing()
        write_parquet_atomic(table, path)
        self.refresh_views()
        return path

    def write_table_batches(self, name: str, dataset: str, batches: Iterable[pa.RecordBatch | pa.Table],
                            notes: dict[str, Any] | None = None) -> Path:  # fmt: skip
        """write_table for a table made batch by batch (millions of captions): each batch is
        written as it comes, so memory holds one; readers see the table when it is whole.
        `notes`: facts about the whole table, kept in the file's metadata (table_notes)."""
        schema = TABLES[name]
        if notes:
            schema = schema.with_metadata({f"mule.{k}".encode(): json.dumps(v).encode() for k, v in notes.items()})
        path = self.workdir.table_path(name, dataset)
        if self.read_only:
            self._committing()  # refuses
        with atomic_path(path) as tmp, pq.ParquetWriter(tmp, schema, compression="zstd") as writer:
            for batch in batches:
                table = pa.Table.from_batches([batch]) if isinstance(batch, pa.RecordBatch) else batch
                writer.write_table(table.select(schema.names).cast(TABLES[name]).replace_schema_metadata(schema.metadata))
            writer.close()
            self._committing()  # readers wait for the rename and the stage's record, not for the batches
        self.refresh_views()
        return path

    def table_notes(self, name: str, dataset: str) -> dict[str, Any]:
        """What write_table_batches noted about a table (the captions' tokenisers): {} when
        none, or no such table (its readers say that)."""
        try:
            metadata = pq.read_schema(self.workdir.table_path(name, dataset)).metadata or {}
        except (OSError, pa.ArrowException):
            return {}
        return {k.decode().removeprefix("mule."): json.loads(v) for k, v in metadata.items() if k.startswith(b"mule.")}

    def has_table(self, name: str, dataset: str) -> bool:
        return self.workdir.table_path(name, dataset).exists()

    def read_table(self, name: str, dataset: str) -> pa.Table:
        path = self.workdir.table_path(name, dataset)
        if not path.exists():
            raise missing_table_error(name, self.workdir, dataset)
        try:
            return pq.read_table(path)
        except (OSError, pa.ArrowException) as error:
            raise damaged_table_error(name, path, error) from None

    def relocate(self, old_root: Path) -> dict[Path, str]:
        """After the workdir moved from old_root: image paths that pointed inside the old
        workdir (the generated dataset) point inside this one; views are rebuilt (they hold
        absolute globs). Returns the tables rewritten, with their digests before (an
        unreadable one is left as it is: the stage that wrote it runs again)."""
        from mule.storage.content_digests import sha256_file

        old, new = str(old_root).rstrip("/") + "/", str(self.workdir.root) + "/"
        rewritten = {}
        for path in sorted((self.workdir.catalog_dir / "images").glob("*.parquet")):
            try:
                table = pq.read_table(path)
            except (OSError, pa.ArrowException):
                continue
            paths = table.column("path").to_pylist()
            moved = [new + p[len(old) :] if p and p.startswith(old) else p for p in paths]
            if any(a != b for a, b in zip(paths, moved)):
                index = table.schema.get_field_index("path")
                before = sha256_file(path)
                write_parquet_atomic(table.set_column(index, "path", pa.array(moved, pa.string())), path)
                rewritten[path] = before
        self.refresh_views()
        return rewritten

    def image_identity(self, dataset: str) -> pa.Table:
        """What makes the images what they are (id, split role, has a file, bytes), not
        where they are."""
        return self.query('SELECT image_id, role, "exists", sha256 FROM images WHERE dataset = ? ORDER BY image_id',
                          [dataset])  # fmt: skip

    def lp_model_path(self, cfg) -> Path:
        """The LP model for a MuleConfig's captions, languages and seed (Workdir.lp_model_path):
        named after its languages when they are not all the dataset has."""
        data = cfg.data
        present = set(self.languages(data.dataset))
        used = tuple(lang for lang in data.languages if lang in present)
        return self.workdir.lp_model_path(data.dataset, data.captions, None if set(used) == present else used,
                                          cfg.train.seed)  # fmt: skip

    def lp_checkpoint_path(self, cfg) -> Path:
        """LP's checkpoint beside its model (pretrain-checkpoint.pt, ...)."""
        path = self.lp_model_path(cfg)
        return path.with_name(f"{path.stem}-checkpoint.pt")

    def languages(self, dataset: str) -> list[str]:
        """The languages of a dataset's captions (human or machine-translated), read from the
        captions tables' lang column alone (a rebuild's keys ask it; DuckDB is not needed)."""
        found: set[str] = set()
        for suffix in ("", ".mt"):
            path = self.workdir.table_path("captions", dataset + suffix)
            if path.exists():
                try:
                    table = pq.ParquetFile(path, read_dictionary=["lang"]).read(columns=["lang"])
                    found.update(distinct_strings(table.column("lang")))
                except (OSError, pa.ArrowException) as error:
                    raise damaged_table_error("captions", path, error) from None
        if not found and not self.workdir.table_path("captions", dataset).exists():
            raise missing_table_error("captions", self.workdir, dataset)
        return sorted(found)

    def datasets(self) -> list[str]:
        return sorted(p.stem for p in (self.workdir.catalog_dir / "images").glob("*.parquet"))

    # -- features -------------------------------------------------------------------
    # Vectors are stored under their extractor's identity (mule_core.extractor_names):
    # the setting, the weights' digest and the extraction code. `current.json` says which
    # identity each setting's vectors are now: the features stage points it at the one it
    # wrote, training reads it. Vectors of other identities stay readable (a model trained
    # on them still finds its own) until they are removed.
    def _current_file(self, dataset: str) -> Path:
        return self.workdir.catalog_dir / "features" / dataset / "current.json"

    def current_extractors(self, dataset: str) -> dict[str, str]:
        """setting name -> identity of its current vectors."""
        try:
            return json.loads(self._current_file(dataset).read_text())
        except (OSError, ValueError):  # none yet (a damaged file: the features stage writes it again)
            return {}

    def current_extractor(self, dataset: str, features) -> str | None:
        """The identity of the current vectors of a FeaturesConfig's setting, if any."""
        from mule.mule_core.extractor_names import setting_name

        identity = self.current_extractors(dataset).get(setting_name(features))
        return identity if identity and self.feature_parts(dataset, identity) else None

    def require_current_extractor(self, dataset: str, features) -> str:
        identity = self.current_extractor(dataset, features)
        if identity is None:
            from mule.mule_core.extractor_names import setting_name

            raise CatalogError(
                f"the catalog in {self.workdir.root} has no features for dataset {dataset!r} from the extractor "
                f"setting {setting_name(features)} yet: run the features stage first (mule run features)"
            )
        return identity

    def set_current_extractor(self, dataset: str, features, identity: str) -> None:
        from mule.mule_core.extractor_names import setting_name

        current = self.current_extractors(dataset) | {setting_name(features): identity}
        self._committing()
        write_json_atomic(current, self._current_file(dataset))

    def feature_identities(self, dataset: str) -> list[dict]:
        """Every set of vectors the catalog holds for a dataset: its identity, rows, bytes on
        disk, and whether a setting's current vectors are these (`mule catalog` lists them;
        delete an identity's folder to free its space)."""
        current = set(self.current_extractors(dataset).values())
        found = []
        for folder in sorted((self.workdir.catalog_dir / "features" / dataset).glob("*/")):
            parts = [p for p in self.feature_parts(dataset, folder.name) if readable_parquet(p)]
            rows = sum(pq.read_metadata(p).num_rows for p in parts)
            found.append({"extractor": folder.name, "rows": rows, "bytes": sum(p.stat().st_size for p in parts),
                          "current": folder.name in current})  # fmt: skip
        return found

    def drop_damaged_parts(self, dataset: str, extractor: str) -> list[Path]:
        """Removes the parts that cannot be read (cut, overwritten): what they held is
        extracted again. Returns them."""
        damaged = [p for p in self.feature_parts(dataset, extractor) if not readable_parquet(p)]
        for part in damaged:
            part.unlink(missing_ok=True)
        if damaged:
            self.refresh_views()
        return damaged

    def feature_parts(self, dataset: str, extractor: str) -> list[Path]:
        return sorted(self.workdir.features_dir(dataset, extractor).glob("part-*.parquet"))

    def extracted_image_ids(self, dataset: str, extractor: str) -> set[str]:
        return set(self.extracted_images(dataset, extractor))

    def extracted_images(self, dataset: str, extractor: str, since: str = "") -> dict[str, str | None]:
        """image id -> SHA-256 of the bytes its features came from (None in parts written
        before the digest was kept); a later part overrides an earlier one. `since`: only
        parts named after it (a forced extraction's own)."""
        done: dict[str, str | None] = {}
        for part in self.feature_parts(dataset, extractor):
            if since and part.name < since:
                continue
            table = pq.read_table(part)
            ids = table.column("image_id").to_pylist()
            shas = (
                table.column("image_sha256").to_pylist() if "image_sha256" in table.column_names else [None] * len(ids)
            )
            done.update(zip(ids, shas))
        return done

    def write_feature_part(self, dataset: str, extractor: str, image_ids: list[str], vectors: np.ndarray,
                           name: str | None = None, image_sha256: list[str | None] | None = None) -> Path:  # fmt: skip
        """One part of the features table. `name` makes it unique without looking at the
        other parts, so several workers can write at once; parts sort by name in the order
        they were written."""
        if name is None:
            parts = self.feature_parts(dataset, extractor)
            name = f"{int(parts[-1].stem.split('-')[1]) + 1 if parts else 0:05d}"
        dim = vectors.shape[1]
        table = pa.table(
            {
                "dataset": pa.array([dataset] * len(image_ids), pa.string()),
                "image_id": pa.array(image_ids, pa.string()),
                "extractor": pa.array([extractor] * len(image_ids), pa.string()),
                "vector": pa.FixedSizeListArray.from_arrays(pa.array(vectors.astype(np.float32).ravel()), dim),
                "image_sha256": pa.array(image_sha256 or [None] * len(image_ids), pa.string()),
            },
            schema=features_schema(dim),
        )
        path = self.workdir.features_dir(dataset, extractor) / f"part-{name}.parquet"
        write_parquet_atomic(table, path)
        return path

    def drop_superseded_features(self, dataset: str, extractor: str, image_ids: set[str], keep: set[str]) -> int:
        """Removes image_ids' rows from every part but those named in `keep` (the parts that
        hold their new features), so the table has one row per image. Returns rows dropped."""
        self._committing()
        dropped = 0
        for part in self.feature_parts(dataset, extractor):
            if part.name in keep:
                continue
            table = pq.read_table(part)
            stale = import_compute().is_in(table.column("image_id"), pa.array(sorted(image_ids), pa.string()))
            n = import_compute().sum(stale).as_py() or 0
            if n == table.num_rows:
                part.unlink()
            elif n:
                write_parquet_atomic(table.filter(import_compute().invert(stale)), part)
            dropped += n
        return dropped

    def write_extractor_info(self, dataset: str, extractor: str, info: dict) -> None:
        write_json_atomic(info, self.workdir.features_dir(dataset, extractor) / "extractor.json")

    def extractor_info(self, dataset: str, extractor: str) -> dict | None:
        path = self.workdir.features_dir(dataset, extractor) / "extractor.json"
        return json.loads(path.read_text()) if path.exists() else None

    def read_features(self, dataset: str, extractor: str, image_ids: list[str]) -> np.ndarray:
        """Vectors in the order of image_ids; error naming the first missing image."""
        parts = self.feature_parts(dataset, extractor)
        if not parts:
            raise CatalogError(
                f"the catalog in {self.workdir.root} has no features for dataset {dataset!r} from extractor "
                f"{extractor} yet: run the features stage first (mule run features)"
            )
        table = pa.concat_tables(pq.read_table(p, columns=["image_id", "vector"]) for p in parts)
        row_of = {image_id: row for row, image_id in enumerate(table.column("image_id").to_pylist())}
        missing = [i for i in image_ids if i not in row_of]
        if missing:
            raise CatalogError(
                f"{len(missing)} images of {dataset!r} have no features from {extractor} "
                f"(first: {missing[0]}); rerun the features stage"
            )
        vectors = table.column("vector").combine_chunks()
        dim = vectors.type.list_size
        flat = vectors.flatten().to_numpy(zero_copy_only=False).reshape(-1, dim)
        return flat[[row_of[i] for i in image_ids]]
