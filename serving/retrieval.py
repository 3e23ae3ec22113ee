"""Querying a trained model: sentence -> images, image -> sentences per language.

The model is the registry's champion for the dataset (or a train run named by id); the
gallery is the catalog's images that have features from the model's extractor (or the
captions, for an image query), of every split unless one is named. A query is searched
as `mule serve` searches it: the query through mule_core.embedder.Embedder, the gallery
through serving.gallery (its vectors, or the index stage's index past index.min_images).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from mule import api
from mule.data_catalog import queries
from mule.data_catalog.tables import Catalog
from mule.datasets.image_files import MAX_PIXELS
from mule.mule_core.embedder import Embedder, EmbedError
from mule.serving import gallery as galleries
from mule.serving.searcher import Searcher, SearchError
from mule.storage.content_digests import sha256_file
from mule.storage.workdir import Workdir


def open_searcher(workdir: Workdir, dataset: str, run_id: str | None = None, version: str | None = None) -> Searcher:
    embedder = api.load(workdir.root, dataset=dataset, run=run_id, version=version)
    if embedder.model.image_branch is None:
        raise SearchError(f"{embedder.label} was trained without images (a text-only dataset): it cannot search images")
    return Searcher(embedder, dataset, Catalog(workdir, read_only=True), embedder.meta["file"])


def embedder(searcher: Searcher) -> Embedder:
    return searcher.embedder


def _encode_text(searcher: Searcher, text: str, lang: str | None):
    try:
        return embedder(searcher).encode_text(text, lang, details=True)[0]
    except EmbedError as error:
        raise SearchError(str(error)) from None


def search_text(searcher: Searcher, text: str, lang: str | None = None, k: int = 5, split: str = "all",
                min_images: int = galleries.MIN_INDEXED_IMAGES) -> dict:
    """The k images closest to the sentence, best first; the index stage's index searched
    for a gallery of min_images or more (as mule serve's index.min_images)."""
    found = _encode_text(searcher, text, lang)
    gallery, how = galleries.open_gallery(searcher, split, min_images=min_images, captions=False)
    results = gallery.top_images(found.vector, k)
    paths = {i: r["path"] for i, r in _image_info(searcher, [r["image_id"] for r in results]).items()}
    results = [{**r, "path": paths.get(r["image_id"], "")} for r in results]
    return {"query": text, "lang": found.lang, "language": found.language, "unknown_words": found.unknown_words,
            "composed_words": found.composed_words, "model": searcher.label, "split": split,
            "gallery": len(gallery.image_ids), "searched": how, "results": results}  # fmt: skip


def _image_info(searcher: Searcher, image_ids: list[str]) -> dict[str, dict]:
    rows = queries.image_rows(searcher.catalog, searcher.dataset, image_ids)
    return {r["image_id"]: {"path": r["path"], "split": r["split"]} for r in rows}


def image_features(searcher: Searcher, path: Path) -> tuple[torch.Tensor, str]:
    """The image's CNN features: the catalog's when it holds these very bytes, else the
    model's extractor run on the file. Returns (features, where they came from)."""
    if not path.is_file():
        raise SearchError(f"{path}: no such image file")
    sha = sha256_file(path)
    found = queries.image_with_bytes(searcher.catalog, searcher.dataset, sha)
    match = [found] if found else []
    extracted = searcher.catalog.extracted_images(searcher.dataset, searcher.meta["extractor"])
    if match and extracted.get(match[0]) == sha:  # the catalog has this image's features from this extractor
        vector = searcher.catalog.read_features(searcher.dataset, searcher.meta["extractor"], match)
        return torch.from_numpy(np.ascontiguousarray(vector, np.float32)), f"catalog image {match[0]}"
    try:
        # the user's own file, on their own machine: Pillow's limit, not a shared server's budget
        return embedder(searcher).image_features(path, MAX_PIXELS), f"extracted with {searcher.meta['extractor']}"
    except EmbedError as error:
        raise SearchError(str(error)) from None


def search_image(searcher: Searcher, path: Path, k: int = 5, split: str = "all") -> dict:
    """The k sentences closest to the image, per language, best first."""
    features, origin = image_features(searcher, Path(path))
    try:
        query = embedder(searcher).images_from_features(features)[0]
    except EmbedError as error:
        raise SearchError(str(error)) from None
    gallery, _ = galleries.open_gallery(searcher, split, images=False)
    return {"image": str(path), "features": origin, "model": searcher.label, "split": split,
            "results": {lang: found for lang, found in gallery.top_captions(query, k).items() if found}}
