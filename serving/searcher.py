"""A trained model and the catalog it searches, as serving holds them: the embedder (the
model as a function), the dataset, and the splits it reads. Its own module so that the
gallery (serving/gallery.py) and the queries (serving/retrieval.py) both use it without
importing each other."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from mule.data_catalog.queries import added_dataset
from mule.data_catalog.splits import load_split
from mule.data_catalog.tables import Catalog
from mule.mule_core.embedder import Embedder
from mule.mule_core.errors import InputError, UserError
from mule.mule_core.model import MuleModel
from mule.mule_core.split_tensors import SplitTensors


class SearchError(UserError, ValueError):
    pass


@dataclass
class Searcher:
    embedder: Embedder  # the model as a function
    dataset: str
    catalog: Catalog
    model_file: Path | None = None  # the file it was read from (the gallery index names the model by its sha256)

    @property
    def model(self) -> MuleModel:
        return self.embedder.model

    @property
    def meta(self) -> dict:
        return self.embedder.meta

    @property
    def label(self) -> str:
        return self.embedder.label

    @property
    def device(self) -> torch.device:
        return self.embedder.device

    @property
    def languages(self) -> list[str]:
        return list(self.meta["vocabulary"].languages)

    @property
    def added(self) -> tuple[str, ...]:
        """Languages added to the model whose captions are in tables of their own (their
        language-captions step's), not among the dataset's."""
        listed = [lang for lang in self.meta.get("added_languages") or ()
                  if self.catalog.has_table("captions", added_dataset(self.dataset, lang))]
        own = set(self.catalog.languages(self.dataset)) if listed else set()
        return tuple(lang for lang in listed if lang not in own)

    def split(self, selector: str, with_features: bool) -> SplitTensors:
        try:
            return load_split(self.catalog, self.dataset, selector, self.meta["vocabulary"],
                              self.meta["cfg"].text.max_tokens, self.meta["extractor"] if with_features else None,
                              added=self.added)  # fmt: skip
        except InputError as error:
            raise SearchError(str(error)) from None
