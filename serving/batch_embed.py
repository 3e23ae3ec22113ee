"""Many images or sentences to vectors, into a folder of Parquet parts (`mule embed`).

    <out>/
      model.json            which model made these vectors (its identity, label, dimension) and of what
      part-00000.parquet    id, vector (float32, unit length) [, lang]: one part per batch of items
      rejects-00000.parquet id, reason: what could not be embedded, and why

A rerun embeds only what no part holds yet (a stopped run resumes, nothing twice); a
folder made by another model is refused, never mixed. Parts are written atomically.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from mule.mule_core.embedder import Embedder, EmbedError
from mule.mule_core.errors import InputError, UserError
from mule.mule_core.progress import Progress
from mule.storage.atomic import write_atomic, write_json_atomic

IMAGE_SUFFIXES = {".jpg", ".jpeg", ".png", ".webp", ".bmp", ".gif", ".tif", ".tiff"}


class OtherModelError(UserError, ValueError):
    pass


def model_identity(embedder: Embedder) -> str:
    """What made the vectors: a digest of the model's weights and vocabularies, the same
    whether it was opened from a model file, an exported folder or the registry
    (data_catalog.model_files.model_digest's, of the model in hand)."""
    from mule.data_catalog.model_files import weights_digest

    return weights_digest(embedder.meta["vocabulary"].words, embedder.model.state_dict())


def open_store(out: Path, embedder: Embedder, kind: str) -> set[str]:
    """The store at `out` for this model (made if new), and the ids it holds already
    (embedded or rejected); another model's store is an error."""
    out.mkdir(parents=True, exist_ok=True)
    identity, marker = model_identity(embedder), out / "model.json"
    if marker.exists():
        made = json.loads(marker.read_text())
        if made.get("identity") != identity or made.get("kind") != kind:
            raise OtherModelError(
                f"{out} holds {made.get('kind')} vectors of model {made.get('label')} (identity {made.get('identity')}); "
                f"{embedder.label} (identity {identity}) would mix two spaces: write to another folder, or delete {out}"
            )
    else:
        write_json_atomic({"identity": identity, "label": embedder.label, "kind": kind,
                           "dimension": int(embedder.meta["cfg"].model.joint_dim)}, marker)  # fmt: skip
    done: set[str] = set()
    for part in sorted(out.glob("part-*.parquet")) + sorted(out.glob("rejects-*.parquet")):
        done.update(pq.read_table(part, columns=["id"]).column("id").to_pylist())
    return done


def _write_part(out: Path, rows: dict[str, list], rejects: list[tuple[str, str]]) -> None:
    number = len(list(out.glob("part-*.parquet")))
    vectors = np.asarray(rows.pop("vector"), dtype=np.float32)
    table = pa.table({**rows, "vector": pa.FixedSizeListArray.from_arrays(vectors.reshape(-1), vectors.shape[1])}) \
        if len(vectors) else None  # fmt: skip
    if rejects:  # first: a part written means its batch is done, rejects included
        found = pa.table({"id": [i for i, _ in rejects], "reason": [r for _, r in rejects]})
        write_atomic(out / f"rejects-{number:05d}.parquet", lambda tmp: pq.write_table(found, tmp))
    if table is not None:
        write_atomic(out / f"part-{number:05d}.parquet", lambda tmp: pq.write_table(table, tmp))


def image_files(folder: Path) -> list[tuple[str, Path]]:
    """(id: the path under the folder, file) of every image file, in name order."""
    if not folder.is_dir():
        raise InputError(f"{folder}: no such folder of images")
    return [(str(p.relative_to(folder)), p) for p in sorted(folder.rglob("*"))
            if p.is_file() and p.suffix.lower() in IMAGE_SUFFIXES]  # fmt: skip


def embed_images(embedder: Embedder, folder: Path, out: Path, batch: int = 64) -> dict:
    """Every image file under `folder` not yet in the store at `out`."""
    files = image_files(Path(folder))
    done = open_store(Path(out), embedder, "images")
    todo = [(i, p) for i, p in files if i not in done]
    progress = Progress("embedding images", len(files), unit="images", logger=logging.getLogger("mule.embed"),
                        done=len(files) - len(todo))  # fmt: skip
    embedded = rejected = 0
    for chunk in _chunks(todo, batch):
        ids, vectors, rejects = [], [], []
        for image_id, path in chunk:  # one at a time: a bad file is rejected with its reason, not the batch
            try:
                vectors.append(embedder.encode_image(path)[0])
                ids.append(image_id)
            except EmbedError as error:
                rejects.append((image_id, str(error)))
        _write_part(Path(out), {"id": ids, "vector": vectors}, rejects)
        embedded, rejected = embedded + len(ids), rejected + len(rejects)
        progress.update(len(chunk))
    progress.finish()
    return {"embedded": embedded, "rejected": rejected, "already": len(files) - len(todo)}


def read_sentences(path: Path) -> pa.Table:
    """A table of sentences: CSV, TSV, JSON Lines or Parquet, with a `text` column (or
    `caption`, `sentence`), and optionally `id` and `lang`."""
    import pyarrow.csv as pcsv
    import pyarrow.json as pjson

    path = Path(path)
    if not path.is_file():
        raise InputError(f"{path}: no such table of sentences")
    suffix = path.suffix.lower()
    try:
        if suffix == ".parquet":
            table = pq.read_table(path)
        elif suffix in (".jsonl", ".json"):
            table = pjson.read_json(path)
        else:
            delimiter = "\t" if suffix == ".tsv" else ","
            table = pcsv.read_csv(path, parse_options=pcsv.ParseOptions(delimiter=delimiter, newlines_in_values=True),
                                  convert_options=pcsv.ConvertOptions(strings_can_be_null=True))  # fmt: skip
    except pa.ArrowInvalid as error:
        raise InputError(f"{path}: not a table mule can read ({str(error).splitlines()[0]})") from None
    text = next((c for c in ("text", "caption", "sentence") if c in table.column_names), None)
    if text is None:
        raise InputError(f"{path}: no text column (text, caption or sentence); its columns: {', '.join(table.column_names)}")
    ids = table.column("id").cast(pa.string()) if "id" in table.column_names else pa.array(
        [str(n) for n in range(1, table.num_rows + 1)])  # fmt: skip
    langs = table.column("lang").cast(pa.string()) if "lang" in table.column_names else pa.nulls(table.num_rows, pa.string())
    return pa.table({"id": ids, "text": table.column(text).cast(pa.string()), "lang": langs})


def embed_sentences(embedder: Embedder, table_path: Path, out: Path, lang: str | None = None, batch: int = 512) -> dict:
    """Every sentence of the table not yet in the store at `out` (its language: the row's,
    else `lang`, else detected)."""
    table = read_sentences(table_path)
    done = open_store(Path(out), embedder, "sentences")
    rows = [r for r in table.to_pylist() if r["id"] not in done]
    progress = Progress("embedding sentences", table.num_rows, unit="sentences", logger=logging.getLogger("mule.embed"),
                        done=table.num_rows - len(rows))  # fmt: skip
    embedded = rejected = 0
    for chunk in _chunks(rows, batch):
        ids, vectors, langs, rejects = [], [], [], []
        for row in chunk:
            try:
                found = embedder.encode_text(row["text"] or "", row["lang"] or lang, details=True)[0]
            except EmbedError as error:
                rejects.append((row["id"], str(error)))
                continue
            ids.append(row["id"])
            vectors.append(found.vector)
            langs.append(found.lang)
        _write_part(Path(out), {"id": ids, "lang": langs, "vector": vectors}, rejects)
        embedded, rejected = embedded + len(ids), rejected + len(rejects)
        progress.update(len(chunk))
    progress.finish()
    return {"embedded": embedded, "rejected": rejected, "already": table.num_rows - len(rows)}


def _chunks(items: list, size: int) -> Iterator[list]:
    for start in range(0, len(items), size):
        yield items[start : start + size]
