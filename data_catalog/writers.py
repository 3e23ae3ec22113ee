"""Which stage writes each catalog entry: the one map of it.

The stage declaration (pipeline/declaration.py) reads its stages' outputs from here
(`Stage.writes`), and the catalog's errors name the stage to run from here (a missing or
damaged table), so the two never disagree. The rebuild's stage comes first where a
sweep's step writes the same entry (a model: train, and extend when a language is added).
"""

from __future__ import annotations

WRITTEN_BY: dict[str, tuple[str, ...]] = {
    "images": ("ingest",),
    "captions": ("ingest",),
    "rejects": ("ingest",),
    "added captions": ("language-captions",),
    "added languages' captions": ("language-captions",),  # each language's step writes its own
    "added rejects": ("language-captions",),
    "mt captions": ("translate",),
    "translations": ("translate",),
    "features": ("features",),
    "image rejects": ("features",),
    "word vectors": ("text",),
    "LP model": ("pretrain",),
    "model": ("train", "extend"),
    "evaluation": ("evaluate",),
    "gallery index": ("index",),
    "translated-query evaluation": ("query-translation",),
}

# The catalog's tables (its DuckDB views), by the entry each belongs to
TABLE_ENTRIES: dict[str, str] = {"images": "images", "captions": "captions", "rejects": "rejects",
                                 "word_vectors": "word vectors", "subword_vectors": "word vectors",
                                 "translations": "translations", "features": "features"}  # fmt: skip


def written_by(stage: str) -> tuple[str, ...]:
    """The entries a stage writes, in this map's order."""
    return tuple(entry for entry, stages in WRITTEN_BY.items() if stage in stages)


def table_writer(table: str) -> str | None:
    """The stage that writes a table (for errors that say what to run)."""
    entry = TABLE_ENTRIES.get(table)
    return WRITTEN_BY[entry][0] if entry in WRITTEN_BY else None
