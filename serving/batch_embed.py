"""Many images or sentences to vectors, into a store (`mule embed`): a folder of Parquet
parts (the default), a LanceDB table or a local Qdrant collection (serving.vector_stores).

    <out>/                  (Parquet)
      model.json            which model made these vectors (its identity, label, dimension) and of what
      part-00000.parquet    id, vector (float32, unit length) [, lang]: one part per batch of items
      rejects-00000.parquet id, reason: what could not be embedded, and why

A rerun embeds only what the store holds no vector or reject of (a stopped run resumes,
nothing twice); a store made by another model is refused, never mixed. An item's id is
what names it for good: an image's path under the folder; a sentence's `id` cell, or
where the table has no id column its content (a digest of its language and text: a row
inserted above it changes nothing). A row repeating an id of an earlier row is embedded
once (the first), and said. Images are opened within ingest's pixel limit (Pillow's,
89,478,485; `max_pixels` raises it).
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from mule.datasets.image_files import CEILING_PIXELS, IMAGE_SUFFIXES, MAX_PIXELS
from mule.mule_core.embedder import Embedder, EmbedError
from mule.mule_core.errors import InputError
from mule.mule_core.progress import SHOWN, Progress
from mule.serving.vector_stores import Maker, OtherModelError, open_store

__all__ = ["embed_images", "embed_sentences", "model_identity", "OtherModelError", "read_sentences", "content_id"]


def model_identity(embedder: Embedder) -> str:
    """What made the vectors: a digest of the model's weights and vocabularies, the same
    whether it was opened from a model file, an exported folder or the registry
    (data_catalog.model_files.model_digest's, of the model in hand), and run by PyTorch or
    its float32 ONNX towers (the same vectors within 1e-5); its int8 towers' vectors are
    others (an image's moves by a cosine of up to 0.1: docs/take-away.md), named apart."""
    from mule.data_catalog.model_files import weights_digest

    digest = weights_digest(embedder.meta["vocabulary"].words, embedder.model.state_dict())
    return f"{digest}+onnx-int8" if getattr(embedder, "int8", False) else digest


def _maker(embedder: Embedder, kind: str) -> Maker:
    return Maker(model_identity(embedder), embedder.label, kind, int(embedder.meta["cfg"].model.joint_dim))


def image_files(folder: Path) -> list[tuple[str, Path]]:
    """(id: the path under the folder, file) of every image file, in name order."""
    if not folder.is_dir():
        raise InputError(f"{folder}: no such folder of images")
    return [(str(p.relative_to(folder)), p) for p in sorted(folder.rglob("*"))
            if p.is_file() and p.suffix.lower() in IMAGE_SUFFIXES]  # fmt: skip


def embed_images(embedder: Embedder, folder: Path, out: Path, batch: int = 64, store: str = "parquet",
                 table: str | None = None, max_pixels: int = MAX_PIXELS, wait: bool = True) -> dict:  # fmt: skip
    """Every image file under `folder` not yet in the store at `out` (`store`: its kind;
    `table`: LanceDB's table or Qdrant's collection, default "images"; `max_pixels`: the
    largest image opened, read from its header: ingest's limit unless raised)."""
    if not 1 <= max_pixels <= CEILING_PIXELS:
        raise InputError(f"max_pixels must be between 1 and {CEILING_PIXELS:,} (twice Pillow's limit: Pillow refuses "
                         f"larger images itself), got {max_pixels:,}")  # fmt: skip
    files = image_files(Path(folder))
    vectors_store = open_store(store, Path(out), _maker(embedder, "images"), table, wait)
    try:
        return _embed_images(embedder, files, vectors_store, batch, max_pixels)
    finally:
        vectors_store.close()


def _embed_images(embedder: Embedder, files: list[tuple[str, Path]], store, batch: int, max_pixels: int) -> dict:
    todo = [(i, p) for i, p in files if i not in store.done]
    progress = Progress("embedding images", len(files), unit="images", logger=logging.getLogger("mule.embed"),
                        done=len(files) - len(todo))  # fmt: skip
    embedded = rejected = 0
    for chunk in _chunks(todo, batch):
        ids, vectors, rejects = [], [], []
        for image_id, path in chunk:  # one at a time: a bad file is rejected with its reason, not the batch
            try:  # ingest's budget: as many pixels, and 4 bytes a pixel decoded (an RGBA photo)
                vectors.append(embedder.encode_image(path, max_pixels=max_pixels, max_bytes=4 * max_pixels)[0])
                ids.append(image_id)
            except EmbedError as error:
                raised = f" (--max-pixels raises the limit, up to {CEILING_PIXELS:,})" if error.kind == "too large" else ""
                rejects.append((image_id, str(error) + raised))
        store.write(ids, np.asarray(vectors, np.float32), {}, rejects)
        embedded, rejected = embedded + len(ids), rejected + len(rejects)
        progress.update(len(chunk))
    progress.finish()
    return {"embedded": embedded, "rejected": rejected, "already": len(files) - len(todo)}


def content_id(text: str | None, lang: str | None) -> str:
    """A sentence's id where its table gives none: a digest of its language (as given: the
    row's, else the command's, else none) and its text, the same wherever the row is."""
    return "s" + hashlib.sha256(f"{lang or ''}\n{text or ''}".encode()).hexdigest()[:24]


TEXT_COLUMNS = ("text", "caption", "sentence")


def read_sentences(path: Path, lang: str | None = None) -> pa.Table:
    """A table of sentences: CSV, TSV, JSON Lines or Parquet, with a `text` column (or
    `caption`, `sentence`), and optionally `id` and `lang`; without an id column, each
    row's id is its content_id (`lang`: the language rows without one are given)."""
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
            # every cell as written: ids 007 and 7 are two ids, and NA, null or nan are words, not missing values
            delimiter = "\t" if suffix == ".tsv" else ","
            as_text = dict.fromkeys(("id", "lang", *TEXT_COLUMNS), pa.string())
            table = pcsv.read_csv(path, parse_options=pcsv.ParseOptions(delimiter=delimiter, newlines_in_values=True),
                                  convert_options=pcsv.ConvertOptions(column_types=as_text, null_values=[],
                                                                      strings_can_be_null=False))  # fmt: skip
    except pa.ArrowInvalid as error:
        raise InputError(f"{path}: not a table mule can read ({str(error).splitlines()[0]})") from None
    text = next((c for c in TEXT_COLUMNS if c in table.column_names), None)
    if text is None:
        raise InputError(f"{path}: no text column (text, caption or sentence); its columns: {', '.join(table.column_names)}")
    langs = table.column("lang").cast(pa.string()) if "lang" in table.column_names else pa.nulls(table.num_rows, pa.string())
    texts = table.column(text).cast(pa.string())
    if "id" in table.column_names:
        ids = table.column("id").cast(pa.string())
        missing = [n for n, value in enumerate(ids.to_pylist(), start=1) if value is None or not value.strip()]
        if missing:
            rows = ", ".join(map(str, missing[:5])) + (f" and {len(missing) - 5} more" if len(missing) > 5 else "")
            raise InputError(f"{path}: {len(missing)} row{'s' if len(missing) > 1 else ''} without an id (row "
                             f"{rows}, counting from the first row after any header): give every row one, or drop "
                             "the id column to have each row's id made from its text")  # fmt: skip
        return pa.table({"id": ids, "text": texts, "lang": langs})
    ids = pa.array([content_id(t, row_lang or lang) for t, row_lang in zip(texts.to_pylist(), langs.to_pylist())],
                   pa.string())  # fmt: skip
    return pa.table({"id": ids, "text": texts, "lang": langs}).replace_schema_metadata({"mule.ids": "content"})


def embed_sentences(embedder: Embedder, table_path: Path, out: Path, lang: str | None = None, batch: int = 512,
                    store: str = "parquet", table: str | None = None, wait: bool = True) -> dict:  # fmt: skip
    """Every sentence of the table not yet in the store at `out` (its language: the row's,
    else `lang`, else detected; `table`: LanceDB's table or Qdrant's collection, default "sentences")."""
    sentences = read_sentences(table_path, lang)
    vectors_store = open_store(store, Path(out), _maker(embedder, "sentences"), table, wait)
    try:
        return _embed_sentences(embedder, sentences, vectors_store, lang, batch)
    finally:
        vectors_store.close()


def _embed_sentences(embedder: Embedder, table: pa.Table, store, lang: str | None, batch: int) -> dict:
    rows, first_row, repeated = [], {}, []  # the rows to embed; id -> its first row; (row, first row, id)
    for number, row in enumerate(table.to_pylist(), start=1):
        if row["id"] in first_row:
            repeated.append((number, first_row[row["id"]], row["id"]))
            continue
        first_row[row["id"]] = number
        if row["id"] not in store.done:
            rows.append(row)
    if repeated:
        number, first, item = repeated[0]
        content = (table.schema.metadata or {}).get(b"mule.ids") == b"content"
        what = "the same sentence (language and text) as an earlier row" if content else "the id of an earlier row"
        example = f"row {number} is row {first}'s sentence" if content else f"row {number} has row {first}'s id {item!r}"
        logging.getLogger("mule.embed").warning("%d row%s repeat %s, embedded once (the first): %s", len(repeated),
                                                "s" if len(repeated) > 1 else "", what, example, extra=SHOWN)  # fmt: skip
    unique = len(first_row)
    progress = Progress("embedding sentences", unique, unit="sentences", logger=logging.getLogger("mule.embed"),
                        done=unique - len(rows))  # fmt: skip
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
        store.write(ids, np.asarray(vectors, np.float32), {"lang": langs}, rejects)
        embedded, rejected = embedded + len(ids), rejected + len(rejects)
        progress.update(len(chunk))
    progress.finish()
    return {"embedded": embedded, "rejected": rejected, "already": unique - len(rows), "repeated": len(repeated)}


def _chunks(items: list, size: int) -> Iterator[list]:
    for start in range(0, len(items), size):
        yield items[start : start + size]
