"""What `mule serve` and `mule search` search: the catalog's images and captions, embedded
once, and the one way they are searched (Gallery.top_images, Gallery.top_captions).

At start-up every image with features from the model's extractor is pushed through the
model's image branch and every caption through its language's branch; a query is then
one matrix-vector product over unit vectors (cosine similarity) and a partial sort. A
large gallery is searched through its approximate index instead (the index stage's,
memory-mapped): no image features or vectors are loaded at all. The gallery also knows
each image's file, by image id: the only files the server ever opens. Every image vector
here is Embedder.images_from_features's, the function `mule embed` and mule.api's
encode_image end in, so the three agree on every image.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from mule.config.sections import IndexConfig
from mule.data_catalog import ann, index_files, queries
from mule.mule_core.embedder import Embedder
from mule.mule_core.encoding import encode_split
from mule.storage.content_digests import sha256_file

if TYPE_CHECKING:
    from mule.serving.searcher import Searcher

log = logging.getLogger("mule.serve")

# Below this many images a gallery is scanned exactly even when the index stage built an index
MIN_INDEXED_IMAGES = IndexConfig.min_images


@dataclass
class Captions:
    ids: list[str]
    texts: list[str]
    image_ids: list[str]
    vectors: np.ndarray  # (n, dim) float32, unit length


@dataclass
class Gallery:
    image_ids: list[str]
    splits: list[str]
    vectors: np.ndarray  # (n, dim) float32, unit length
    files: dict[str, Path]  # image id -> its file (images whose file exists)
    captions: dict[str, Captions] = field(default_factory=dict)  # per language
    index: object | None = None  # a data_catalog.ann index over the images (rows = image_ids), else the exact scan

    @property
    def nbytes(self) -> int:
        return self.vectors.nbytes + sum(c.vectors.nbytes for c in self.captions.values())

    @property
    def index_kind(self) -> str:
        if self.index is None:
            return "exact"
        d = ann.describe(self.index)
        if "cells" in d:
            return f"{d['kind']} ({d['cells']} cells, {d['breadth']} scanned a query)"
        return d["kind"] + (f" (breadth {d['breadth']})" if "breadth" in d else "")

    def top_images(self, query: np.ndarray, k: int) -> list[dict]:
        """The k images closest to the query, best first: rank, image id, split, score."""
        if self.index is not None:
            scores, rows = ann.search(self.index, query, k)
            found = [(int(i), float(s)) for i, s in zip(rows[0], scores[0]) if i >= 0]
        else:
            found = top_k(self.vectors, query, k)
        return [{"rank": r + 1, "image_id": self.image_ids[i], "split": self.splits[i], "score": s}
                for r, (i, s) in enumerate(found)]  # fmt: skip

    def top_captions(self, query: np.ndarray, k: int) -> dict[str, list[dict]]:
        """Per language, the k captions closest to the query, best first."""
        return {lang: [{"rank": r + 1, "caption_id": c.ids[i], "text": c.texts[i], "image_id": c.image_ids[i],
                        "score": s} for r, (i, s) in enumerate(top_k(c.vectors, query, k))]
                for lang, c in self.captions.items()}  # fmt: skip


def top_k(vectors: np.ndarray, query: np.ndarray, k: int) -> list[tuple[int, float]]:
    """(row, score) of the k rows with the largest dot product with `query`, best first."""
    if len(vectors) == 0:
        return []
    scores = vectors @ query.astype(np.float32, copy=False)
    k = min(k, len(scores))
    top = np.argpartition(-scores, k - 1)[:k]
    top = top[np.argsort(-scores[top], kind="stable")]
    return [(int(i), float(scores[i])) for i in top]


def stored_index(searcher: Searcher, model_name: str = "model", breadth: int = 0) -> tuple[object | None, str]:
    """(the index stage's index of this model's gallery, or None; why not, or what it is).
    breadth: the search breadth (index.breadth, given to mule serve); 0: the kind's default."""
    wd = searcher.catalog.workdir
    problem = index_files.index_problem(wd, searcher.dataset, model_name)
    if problem:
        return None, f"no usable gallery index ({problem}; mule run index builds it)"
    found = index_files.read_index(wd, searcher.dataset, model_name)
    if found is None:
        return None, "no usable gallery index (mule run index builds it)"
    index, ids, info = found
    if searcher.model_file is None or info.get("model_sha256") != sha256_file(searcher.model_file):
        return None, "the gallery index was built for another model (mule run index rebuilds it)"
    ann.set_breadth(index, breadth or ann.default_breadth(index))
    return (index, ids), f"gallery index of {len(ids):,} images"


def open_gallery(searcher: Searcher, split: str = "all", index: str = "auto", breadth: int = 0,
                 min_images: int = MIN_INDEXED_IMAGES, images: bool = True, captions: bool = True) -> tuple[Gallery, str]:
    """The gallery `mule serve` and `mule search` search, and how its images are searched.
    index: "auto" (the index stage's index when it is this model's and covers at least
    min_images), "on" (whenever it is usable) or "off" (the exact scan); only split "all"
    has one. images / captions: leave out what a caller never searches."""
    stored, how = None, "exact scan"
    if images and index != "off" and split == "all":
        stored, why = stored_index(searcher, breadth=breadth)
        if stored is not None and (len(stored[1]) >= min_images or index == "on"):
            how = why
        else:
            if index == "on":
                log.warning("%s: scanning every image exactly", why)
            stored = None
    gallery = load_gallery(searcher, split, stored, images=images, captions=captions)
    return gallery, (gallery.index_kind if stored is not None else how)


def load_gallery(searcher: Searcher, split: str = "all", stored: tuple[object, list[str]] | None = None,
                 images: bool = True, captions: bool = True) -> Gallery:
    """The dataset's images (with features from the model's extractor) and captions, of
    one split or all, embedded by the searcher's model. stored: (the stored index, its
    image ids; stored_index's) to search the images with instead of their vectors (split
    "all" only). images / captions False: that side is left empty (no vectors made)."""
    if stored is not None and split != "all":
        raise ValueError("a gallery index covers every split: search one split with the exact scan")
    data = searcher.split(split, with_features=images and stored is None)
    dim = searcher.meta["cfg"].model.joint_dim
    image_ids = list(stored[1]) if stored is not None else list(data.image_ids) if images else []
    # an indexed gallery can be millions of images: every row at once, not an IN list of them
    named = None if stored is not None else image_ids
    rows = {r["image_id"]: r for r in queries.image_rows(searcher.catalog, searcher.dataset, named)} if image_ids else {}
    files = {i: Path(r["path"]) for i, r in rows.items() if r["exists"] and r["path"]}
    splits = [rows[i]["split"] if i in rows else "" for i in image_ids]
    vectors = np.zeros((0, dim), np.float32)
    if images and stored is None:
        vectors = searcher.embedder.images_from_features(data.features)
    by_language = _captions(searcher, dataclasses.replace(data, features=None)) if captions else {}
    return Gallery(image_ids, splits, vectors, files, by_language, stored[0] if stored is not None else None)


def _captions(searcher: Searcher, data) -> dict[str, Captions]:
    """Every caption of the split, per language, as the evaluate stage embeds them."""
    encoded = encode_split(searcher.model, data, searcher.device)
    texts = queries.caption_texts(searcher.catalog, searcher.dataset, data.caption_ids, searcher.added)
    caption_vectors = _unit(encoded["caption_joint"].cpu().numpy())
    out = {}
    for index, lang in enumerate(data.languages):
        picked = np.nonzero(data.caption_lang == index)[0]
        ids = [data.caption_ids[r] for r in picked]
        out[lang] = Captions(ids, [texts.get(c, "") for c in ids],
                             [data.image_ids[data.caption_image[r]] for r in picked],
                             np.ascontiguousarray(caption_vectors[picked]))  # fmt: skip
    return out


def synthetic_gallery(embedder: Embedder, n: int, seed: int = 0) -> Gallery:
    """n images that are not there: random CNN features pushed through the model's image
    branch, as load_gallery does with real ones (for bench/serve_latency.py)."""
    rng = np.random.default_rng(seed)
    dim = int(embedder.model.image_mean.numel())
    features = np.abs(rng.standard_normal((n, dim), dtype=np.float32))  # ReLU-pooled features are non-negative
    vectors = embedder.images_from_features(features)
    return Gallery([f"synthetic-{i:07d}" for i in range(n)], ["synthetic"] * n, vectors, {})


def _unit(vectors: np.ndarray) -> np.ndarray:
    vectors = np.asarray(vectors, dtype=np.float32)
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    return np.ascontiguousarray(vectors / np.maximum(norms, 1e-12))
