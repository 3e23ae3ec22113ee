"""Where `mule embed` puts vectors: a folder of Parquet parts, a LanceDB table or a local
Qdrant collection (both embedded in the process: no server). Each store records which
model made its vectors and refuses another's; each says which ids it holds already
(vectors and rejects), so a rerun embeds only the rest.

    store = open_store("lancedb", out, table="images", made_by=Maker(identity, label, "images", 128))
    store.done                       # ids embedded or rejected before
    store.write(ids, vectors, {"lang": [...]}, rejects=[(id, reason)])
    store.close()

A batch is written rejects first, vectors last: a batch whose vectors are stored is done.
"""

from __future__ import annotations

import json
import logging
import uuid
from contextlib import ExitStack
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from mule.mule_core.errors import UserError
from mule.mule_core.progress import SHOWN
from mule.storage.atomic import write_atomic, write_json_atomic
from mule.storage.locks import folder_lock

KINDS = ("parquet", "lancedb", "qdrant")
META_KEY = "mule"  # LanceDB: the schema's metadata key; Qdrant: the collection's metadata key


class OtherModelError(UserError, ValueError):
    pass


@dataclass(frozen=True)
class Maker:
    """The model that makes a store's vectors, and of what."""

    identity: str  # a digest of its weights and vocabularies (data_catalog.model_files.weights_digest)
    label: str
    kind: str  # "images" or "sentences"
    dimension: int

    def refuse_other(self, where: str, made: dict) -> None:
        if made.get("identity") != self.identity or made.get("kind") != self.kind:
            raise OtherModelError(
                f"{where} holds {made.get('kind')} vectors of model {made.get('label')} (identity {made.get('identity')}); "
                f"{self.label} (identity {self.identity}) would mix two spaces: write to another store, or delete {where}"
            )


class NotAStoreError(UserError, ValueError):
    pass


# What a store of each kind holds at its top (a folder holding anything else is not one)
_STORE_FILES = {"parquet": lambda name: name == "model.json" or name.endswith(".parquet")
                            or (name.startswith(".") and ".tmp-" in name),  # storage.atomic's, cut by a stop
                "lancedb": lambda name: name.endswith(".lance"),
                "qdrant": lambda name: name in (".lock", "meta.json", "collection")}  # fmt: skip


def refuse_foreign(kind: str, out: Path) -> None:
    """--out must be absent, empty, or a store of this kind: a folder of the user's (or a
    file) is refused, never written into."""
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise NotAStoreError(f"{out} is a file: --out names the folder of a {kind} store (absent, empty, or one "
                             "mule embed wrote)")  # fmt: skip
    foreign = sorted(p.name for p in out.iterdir() if not _STORE_FILES[kind](p.name)) if out.is_dir() else []
    if foreign:
        shown = ", ".join(foreign[:5]) + (f" and {len(foreign) - 5} more" if len(foreign) > 5 else "")
        raise NotAStoreError(f"{out} holds files that are not a {kind} store's ({shown}): name an absent or empty "
                             "folder, or a store mule embed wrote")  # fmt: skip


def open_store(kind: str, out: Path, made_by: Maker, table: str | None = None, wait: bool = True):
    """The store at `out`, for this process's writes alone until it is closed: a second
    writer into it says who holds it in one line and waits, or without `wait` is refused
    (its batches would be numbered as the first's, and each would embed what the other is
    embedding)."""
    if kind not in KINDS:
        raise ValueError(f"store must be one of {', '.join(KINDS)}, got {kind!r}")
    out = Path(out)
    refuse_foreign(kind, out)
    out.mkdir(parents=True, exist_ok=True)
    held = ExitStack()
    held.enter_context(folder_lock(out, lambda who: logging.getLogger("mule.embed").warning(
        "%s is being written by %s: waiting for it to finish (Ctrl-C stops waiting)", out, who, extra=SHOWN),
        wait=wait))  # fmt: skip
    try:
        store = {"parquet": ParquetStore, "lancedb": LanceStore, "qdrant": QdrantStore}[kind](out, made_by,
                                                                                         table or made_by.kind)  # fmt: skip
    except BaseException:
        held.close()
        raise
    store.held = held  # closed with the store
    return store


def _vector_array(vectors: np.ndarray) -> pa.FixedSizeListArray:
    return pa.FixedSizeListArray.from_arrays(pa.array(vectors.reshape(-1)), vectors.shape[1])


class _Store:
    """What every store does on close: its own closing, then letting go of the folder (open_store)."""

    held: ExitStack | None = None

    def close(self) -> None:
        try:
            self._close()
        finally:
            if self.held is not None:
                self.held.close()

    def _close(self) -> None:
        pass


class ParquetStore(_Store):
    """<out>/model.json (the maker), part-NNNNN.parquet (id, vector[, lang]), rejects-NNNNN.parquet
    (id, reason): NNNNN numbers the batch, so a batch's rejects and vectors share it and no
    batch writes over another's (every batch after the store's last one, whatever it held)."""

    def __init__(self, out: Path, made_by: Maker, table: str):
        out.mkdir(parents=True, exist_ok=True)
        self.out, marker = out, out / "model.json"
        if marker.exists():
            made_by.refuse_other(str(out), json.loads(marker.read_text()))
        else:
            write_json_atomic(asdict(made_by), marker)
        self.done: set[str] = set()
        files = sorted(out.glob("part-*.parquet")) + sorted(out.glob("rejects-*.parquet"))
        for part in files:
            self.done.update(pq.read_table(part, columns=["id"]).column("id").to_pylist())
        numbers = [int(n) for f in files if (n := f.stem.rpartition("-")[2]).isdigit()]
        self.batch = max(numbers, default=-1) + 1

    def write(self, ids: list[str], vectors: np.ndarray, columns: dict[str, list], rejects: list[tuple[str, str]]) -> None:
        number, self.batch = self.batch, self.batch + 1
        if rejects:
            found = pa.table({"id": [i for i, _ in rejects], "reason": [r for _, r in rejects]})
            write_atomic(self.out / f"rejects-{number:05d}.parquet", lambda tmp: pq.write_table(found, tmp))
        if ids:
            table = pa.table({"id": ids, **columns, "vector": _vector_array(vectors)})
            write_atomic(self.out / f"part-{number:05d}.parquet", lambda tmp: pq.write_table(table, tmp))

class LanceStore(_Store):
    """A LanceDB database at <out>: table <table> (id, vector[, lang]; the maker in the
    schema's metadata) and <table>_rejects (id, reason). Each add is one Lance commit."""

    def __init__(self, out: Path, made_by: Maker, table: str):
        import lancedb

        self.db, self.name, self.made_by = lancedb.connect(str(out)), table, made_by
        names = set(self.db.table_names())
        self.table = self.db.open_table(table) if table in names else None
        self.rejects = self.db.open_table(f"{table}_rejects") if f"{table}_rejects" in names else None
        self.done: set[str] = set()
        if self.table is not None:
            meta = (self.table.schema.metadata or {}).get(META_KEY.encode())
            made_by.refuse_other(f"{out} (table {table})", json.loads(meta) if meta else {"label": "unknown (no mule marker)"})
            self.done.update(_lance_ids(self.table))
        if self.rejects is not None:
            self.done.update(_lance_ids(self.rejects))

    def write(self, ids: list[str], vectors: np.ndarray, columns: dict[str, list], rejects: list[tuple[str, str]]) -> None:
        if rejects:
            found = pa.table({"id": [i for i, _ in rejects], "reason": [r for _, r in rejects]})
            if self.rejects is None:
                self.rejects = self.db.create_table(f"{self.name}_rejects", found)
            else:
                self.rejects.add(found)
        if ids:
            data = pa.table({"id": ids, **columns, "vector": _vector_array(vectors)})
            if self.table is None:
                meta = {META_KEY: json.dumps(asdict(self.made_by))}
                self.table = self.db.create_table(self.name, data.replace_schema_metadata(meta))
            else:
                self.table.add(data)

def _lance_ids(table) -> list[str]:
    """A LanceDB table's ids, read alone (Lance reads the columns asked for: not the vectors)."""
    return table.search().select(["id"]).limit(None).to_arrow().column("id").to_pylist()


class QdrantStore(_Store):
    """A local Qdrant (qdrant_client's embedded mode) at <out>: collection <table> (cosine;
    a point per item, its id in the payload; the maker in the collection's metadata) and
    <table>_rejects (payload id, reason; no vectors)."""

    def __init__(self, out: Path, made_by: Maker, table: str):
        from qdrant_client import QdrantClient, models

        self.models, self.name, self.made_by = models, table, made_by
        self.client = QdrantClient(path=str(out))
        self.done: set[str] = set()
        if self.client.collection_exists(table):
            made = (self.client.get_collection(table).config.metadata or {}).get(META_KEY)
            made_by.refuse_other(f"{out} (collection {table})", made or {"label": "unknown (no mule marker)"})
            self.done.update(self._ids(table))
        else:
            self.client.create_collection(table, vectors_config=models.VectorParams(
                size=made_by.dimension, distance=models.Distance.COSINE), metadata={META_KEY: asdict(made_by)})  # fmt: skip
        if self.client.collection_exists(f"{table}_rejects"):
            self.done.update(self._ids(f"{table}_rejects"))
        else:
            self.client.create_collection(f"{table}_rejects", vectors_config={})

    def _ids(self, collection: str) -> list[str]:
        found, offset = [], None
        while True:
            points, offset = self.client.scroll(collection, limit=1024, offset=offset, with_payload=["id"])
            found.extend(p.payload["id"] for p in points)
            if offset is None:
                return found

    @staticmethod
    def point_id(item: str) -> str:
        """Qdrant ids are integers or UUIDs: the item's id as a UUID (the same item, the same point)."""
        return str(uuid.uuid5(uuid.NAMESPACE_URL, f"mule:{item}"))

    def write(self, ids: list[str], vectors: np.ndarray, columns: dict[str, list], rejects: list[tuple[str, str]]) -> None:
        models = self.models
        if rejects:
            self.client.upsert(f"{self.name}_rejects", [models.PointStruct(id=self.point_id(i), vector={},
                               payload={"id": i, "reason": r}) for i, r in rejects])  # fmt: skip
        if ids:
            self.client.upsert(self.name, [
                models.PointStruct(id=self.point_id(item), vector=vectors[n].tolist(),
                                   payload={"id": item, **{k: v[n] for k, v in columns.items()}})
                for n, item in enumerate(ids)])  # fmt: skip

    def _close(self) -> None:
        self.client.close()
