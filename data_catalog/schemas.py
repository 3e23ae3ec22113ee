"""Schemas of the catalog tables. Every writer goes through these, so a table's columns
and types are the same whichever reader filled it."""

from __future__ import annotations

import pyarrow as pa

IMAGES = pa.schema(
    [
        ("dataset", pa.string()),
        ("image_id", pa.string()),
        ("file_name", pa.string()),
        ("path", pa.string()),  # where the file is (or would be) on this machine
        ("split", pa.string()),  # official split name: train, val, test_2016, ...
        ("role", pa.string()),  # train | val | test | extra
        ("exists", pa.bool_()),
        ("sha256", pa.string()),  # null when the file is missing
        ("width", pa.int32()),
        ("height", pa.int32()),
    ]
)

CAPTIONS = pa.schema(
    [
        ("caption_id", pa.string()),  # <source file>:<line>
        ("dataset", pa.string()),
        ("image_id", pa.string()),
        ("split", pa.string()),
        ("role", pa.string()),
        ("lang", pa.string()),
        ("text", pa.string()),
        ("tokens", pa.list_(pa.string())),
        ("source", pa.string()),  # multi30k/task2, multi30k/task1, mt:<backend>, ...
        ("source_file", pa.string()),  # relative to the dataset root
        ("line", pa.int32()),  # 1-based
        ("origin_caption_id", pa.string()),  # the caption this one translates, if any
        ("also_in", pa.string()),  # file:line of an identical line merged into this row
        ("source_version", pa.string()),  # machine translations: the backend's version
    ]
)

TRANSLATIONS = pa.schema(
    [
        ("dataset", pa.string()),
        ("backend", pa.string()),
        ("backend_version", pa.string()),
        ("source_lang", pa.string()),
        ("target_lang", pa.string()),
        ("source_sha256", pa.string()),
        ("source_text", pa.string()),
        ("text", pa.string()),
        ("created", pa.float64()),  # unix time
    ]
)

REJECTS = pa.schema(
    [
        ("dataset", pa.string()),
        ("source_file", pa.string()),
        ("line", pa.int32()),  # null for a whole file (or an image file)
        ("kind", pa.string()),  # invalid_utf8, empty, control_char, too_long, no_image, duplicate_image, ...
        ("reason", pa.string()),
        ("raw", pa.string()),  # the line, undecodable bytes as \xNN escapes
        ("raw_bytes", pa.binary()),  # the line as it was (capped at data.max_caption_bytes)
    ]
)

WORD_VECTORS = pa.schema(
    [
        ("dataset", pa.string()),
        ("lang", pa.string()),
        ("index", pa.int32()),  # row in the model's embedding matrix; 0 = <pad>, 1 = <unk>
        ("token", pa.string()),
        ("train_count", pa.int64()),
        ("vector", pa.list_(pa.float32())),
        ("source", pa.string()),  # fasttext:trained | file:<path>
    ]
)

# The character n-grams that two or more vocabulary words share (model.subwords) and their
# vectors in the word-vector model the words' came from (fastText's input rows): what a
# word outside the vocabulary is composed from.
SUBWORD_VECTORS = pa.schema(
    [
        ("dataset", pa.string()),
        ("lang", pa.string()),
        ("ngram", pa.string()),
        ("vector", pa.list_(pa.float32())),
        ("source", pa.string()),  # fasttext:trained | file:<path>
    ]
)


def features_schema(dim: int) -> pa.Schema:
    return pa.schema(
        [
            ("dataset", pa.string()),
            ("image_id", pa.string()),
            ("extractor", pa.string()),
            ("vector", pa.list_(pa.float32(), dim)),
            ("image_sha256", pa.string()),  # the bytes these features were computed from
        ]
    )


TABLES = {"images": IMAGES, "captions": CAPTIONS, "rejects": REJECTS, "word_vectors": WORD_VECTORS,
          "subword_vectors": SUBWORD_VECTORS, "translations": TRANSLATIONS}  # fmt: skip
