"""The catalog as one stage's computation sees it: the entries its declaration names
(what it reads and what it writes), and a loud error for any other.

A stage's key holds the digests of the entries it declares (pipeline.decisions), so a
computation that reads another would be reused after that entry changed: a stale result
nobody sees. The config is guarded the same way (config.stage_view). Reads are checked
where they reach the catalog: a query of its views, a table read or written by name, the
feature parts, the LP model's path. Everything else passes through.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

from mule.data_catalog.tables import VIEWS, Catalog
from mule.data_catalog.writers import TABLE_ENTRIES


class UndeclaredEntryError(RuntimeError):
    """A stage's computation reached a catalog entry its declaration does not name: a bug."""


# Catalog methods that reach one entry, by method
METHOD_ENTRIES = {
    **dict.fromkeys(("read_features", "feature_parts", "extracted_image_ids", "extracted_images", "write_feature_part",
                     "drop_superseded_features", "drop_damaged_parts", "current_extractor", "current_extractors",
                     "require_current_extractor", "set_current_extractor", "write_extractor_info", "extractor_info",
                     "feature_identities"), "features"),
    "lp_model_path": "LP model", "lp_checkpoint_path": "LP model", "image_identity": "images",
}  # fmt: skip


def table_entry(name: str, dataset: str) -> str:
    """The entry a table of this name and dataset belongs to (a dataset's MT captions and
    its image rejects are tables of their own under a suffix)."""
    if name == "captions" and dataset.endswith(".mt"):
        return "mt captions"
    if name == "rejects" and dataset.endswith(".images"):
        return "image rejects"
    if "+" in dataset and name in ("captions", "rejects"):  # an added language's (queries.added_dataset)
        return f"added {name}"
    return TABLE_ENTRIES.get(name, name)


class DeclaredCatalog:
    def __init__(self, catalog: Catalog, stage: str, entries: Iterable[str]):
        self._catalog, self._stage, self._entries = catalog, stage, frozenset(entries)

    def _check(self, entry: str, how: str) -> None:
        if entry not in self._entries:
            raise UndeclaredEntryError(
                f"stage {self._stage} reached the catalog entry {entry!r} ({how}), and its declaration "
                f"(pipeline/declaration.py: reads; data_catalog/writers.py: writes) names no such entry: declare "
                f"it, so that the stage's key holds it"
            )

    def query(self, sql: str, params: list | None = None):
        for view in VIEWS:
            if re.search(rf"\b{view}\b", sql):
                self._check(TABLE_ENTRIES[view], f"a query of {view}")
        return self._catalog.query(sql, params)

    def read_table(self, name: str, dataset: str):
        self._check(table_entry(name, dataset), f"reading the {name} table of {dataset}")
        return self._catalog.read_table(name, dataset)

    def write_table(self, name: str, dataset: str, *args, **kwargs):
        self._check(table_entry(name, dataset), f"writing the {name} table of {dataset}")
        return self._catalog.write_table(name, dataset, *args, **kwargs)

    def write_table_batches(self, name: str, dataset: str, *args, **kwargs):
        self._check(table_entry(name, dataset), f"writing the {name} table of {dataset}")
        return self._catalog.write_table_batches(name, dataset, *args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        if name in METHOD_ENTRIES:
            self._check(METHOD_ENTRIES[name], f"Catalog.{name}")
        return getattr(self._catalog, name)
