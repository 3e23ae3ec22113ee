"""Where a gallery's approximate index lives and how it is written and read: the index
stage's output (tasks/index.py), what `mule serve` searches past a size threshold.

    catalog/index/<dataset>/<model name>/index.faiss   FAISS's own file (data_catalog.ann)
                                         rows.parquet  image id of each row, in order
                                         index.json    what made it: the model file's
                                                       sha256, the extractor, the sizes

Each file is written atomically and index.json last, with the other two files' sizes and
sha256: a set cut short by a crash, or a file damaged since, reads as no index (and the
stage runs again), never as a wrong one. The index is read memory-mapped, so it costs
the server the pages its queries touch, not its size.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from mule.data_catalog.table_access import write_parquet_atomic
from mule.storage.atomic import write_atomic, write_json_atomic
from mule.storage.content_digests import sha256_file
from mule.storage.workdir import Workdir

FILES = ("index.faiss", "rows.parquet", "index.json")


def index_dir(wd: Workdir, dataset: str, model_name: str = "model") -> Path:
    return wd.catalog_dir / "index" / dataset / model_name


def index_files(wd: Workdir, dataset: str, model_name: str = "model") -> list[Path]:
    folder = index_dir(wd, dataset, model_name)
    return [folder / name for name in FILES]


def write_index(wd: Workdir, dataset: str, model_name: str, index, image_ids: list[str], info: dict) -> Path:
    import faiss

    from mule.storage.locks import committing, holds_lock

    folder = index_dir(wd, dataset, model_name)
    faiss_file, rows_file, info_file = index_files(wd, dataset, model_name)
    if holds_lock(wd):  # three files mule serve reads together: they appear at once (storage.locks)
        committing(wd)
    write_atomic(faiss_file, lambda tmp: faiss.write_index(index, str(tmp)))
    write_parquet_atomic(pa.table({"image_id": pa.array(image_ids, pa.string())}), rows_file)
    files = {p.name: {"bytes": p.stat().st_size, "sha256": sha256_file(p)} for p in (faiss_file, rows_file)}
    write_json_atomic({**info, "rows": len(image_ids), "files": files}, info_file)
    return folder


def index_problem(wd: Workdir, dataset: str, model_name: str = "model", check_digests: bool = True) -> str | None:
    """Why the stored index cannot be used (missing, cut short, damaged), or None."""
    faiss_file, rows_file, info_file = index_files(wd, dataset, model_name)
    try:
        info = json.loads(info_file.read_text())
        for path in (faiss_file, rows_file):
            want = info["files"][path.name]
            if path.stat().st_size != want["bytes"] or (check_digests and sha256_file(path) != want["sha256"]):
                return f"{path} is not the file {info_file.name} records (damaged or cut short)"
    except FileNotFoundError as missing:
        return f"{missing.filename} is missing"
    except (ValueError, KeyError, TypeError) as error:
        return f"{info_file} is unreadable ({error})"
    return None


def read_index(wd: Workdir, dataset: str, model_name: str = "model") -> tuple[object, list[str], dict] | None:
    """(the index, memory-mapped; the image id of each row; what made it), or None when
    there is no usable one (index_problem says why)."""
    import faiss

    if index_problem(wd, dataset, model_name, check_digests=False):
        return None
    faiss_file, rows_file, info_file = index_files(wd, dataset, model_name)
    index = faiss.read_index(str(faiss_file), faiss.IO_FLAG_MMAP_IFC | faiss.IO_FLAG_READ_ONLY)
    ids = pq.read_table(rows_file).column("image_id").to_pylist()
    info = json.loads(info_file.read_text())
    if len(ids) != index.ntotal:
        return None
    return index, ids, info


def rows_of(ids: list[str], wanted: list[str]) -> np.ndarray:
    position = {image_id: row for row, image_id in enumerate(ids)}
    return np.array([position.get(i, -1) for i in wanted], dtype=np.int64)
