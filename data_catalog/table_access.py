"""Reaching the catalog's files safely: a Parquet file checked readable before DuckDB sees
it, DuckDB imported only when a query runs (and its in-memory connection shared per
thread), a lock conflict told apart from a damaged file, and errors that name the stage
to run (data_catalog.writers)."""

from __future__ import annotations

import os
import re
import threading
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from mule.data_catalog.writers import table_writer
from mule.mule_core.errors import UserError
from mule.storage.atomic import atomic_path, write_atomic, write_json_atomic, write_text_atomic  # noqa: F401 - the catalog's writers
from mule.storage.workdir import Workdir

MISSING_TABLE = re.compile(r"Table with name (\w+) does not exist", re.IGNORECASE)


class CatalogError(UserError, RuntimeError):
    pass


def missing_table_error(table: str, workdir: Workdir, dataset: str | None = None) -> CatalogError:
    stage = table_writer(table)
    where = f"for dataset {dataset!r} " if dataset else ""
    run = f"run the {stage} stage first (mule run {stage})" if stage else "run the stages before this one first"
    return CatalogError(f"the catalog in {workdir.root} has no {table} table {where}yet: {run}")


def damaged_table_error(table: str, path: Path, error: Exception) -> CatalogError:
    stage = table_writer(table)
    run = f"run `mule run {stage}` to write it again" if stage else "run the stage that writes it again"
    return CatalogError(f"{path} cannot be read ({str(error).splitlines()[0][:160]}): the file is damaged; {run}")


def readable_parquet(path: Path) -> bool:
    """The file's footer and schema can be read (a cut or overwritten file cannot)."""
    try:
        pq.read_metadata(path)
        return True
    except (OSError, pa.ArrowException):
        return False


def import_duckdb():
    """DuckDB, imported when a query runs (a quarter of a second: deciding that nothing has
    to run needs none)."""
    import duckdb

    return duckdb


def import_compute():
    import pyarrow.compute

    return pyarrow.compute


def is_lock_conflict(error: Exception) -> bool:
    """DuckDB's answer when another process holds the database file: not damage."""
    text = str(error).lower()
    return "lock" in text and ("conflicting" in text or "could not set" in text)


_memory: tuple[int, object] | None = None  # (pid, this process's in-memory DuckDB)
_memory_lock = threading.Lock()


def in_memory_connection():
    """A connection of its own to this process's in-memory DuckDB, made on first use: a
    new database costs 17 ms (its thread pool), a connection to one under 1 ms, and a
    rebuild runs dozens of queries. Views made on it are TEMP, its own."""
    global _memory
    with _memory_lock:
        if _memory is None or _memory[0] != os.getpid():  # a forked child never uses its parent's
            _memory = (os.getpid(), import_duckdb().connect())
        return _memory[1].cursor()


def close_in_memory() -> None:
    """Before a fork: the database's threads would not exist in the child (the next query
    in the parent makes a new one)."""
    global _memory
    memory, _memory = _memory, None
    if memory is not None and memory[0] == os.getpid():
        memory[1].close()


os.register_at_fork(before=close_in_memory)


def duckdb_readable(path: Path) -> bool:
    """The file opens as a DuckDB database (read-only: a lock conflict also proves it one)."""
    try:
        import_duckdb().connect(str(path), read_only=True).close()
        return True
    except import_duckdb().Error as error:
        return is_lock_conflict(error)


def quoted(text: str) -> str:
    return text.replace("'", "''")


def write_parquet_atomic(table: pa.Table, path: Path) -> Path:
    return write_atomic(path, lambda tmp: pq.write_table(table, tmp, compression="zstd"))


def distinct_strings(column: pa.ChunkedArray) -> set[str]:
    """The values of a dictionary-read string column: each chunk's dictionary entries that
    its indices use (a dictionary may hold more). Without pyarrow.compute, whose import is
    a tenth of a no-change rebuild, nor Arrow's to_numpy, which imports pandas: the
    indices' buffer read as it lies."""
    found: set[str] = set()
    for chunk in column.chunks:
        values, indices = chunk.dictionary.to_pylist(), chunk.indices
        if indices.null_count:  # rare: the nulls left out, by hand
            used = {i for i in indices.to_pylist() if i is not None}
        else:
            width = np.dtype(f"int{indices.type.bit_width}")
            raw = np.frombuffer(indices.buffers()[1], dtype=width, count=len(indices), offset=indices.offset * width.itemsize)
            used = np.unique(raw).tolist()
        found.update(values[i] for i in used if values[i] is not None)
    return found
