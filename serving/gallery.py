"""What `mule serve` searches: the catalog's images and captions, embedded once.

At start-up every image with features from the model's extractor is pushed through the
model's image branch and every caption through its language's branch; a query is then
one matrix-vector product over unit vectors (cosine similarity) and a partial sort. The
gallery also knows each image's file, by image id: the only files the server ever opens.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from data_catalog import queries
from mule_core.embedder import Embedder
from mule_core.training import encode_split

from .search import Searcher


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

    @property
    def nbytes(self) -> int:
        return self.vectors.nbytes + sum(c.vectors.nbytes for c in self.captions.values())

    def top_images(self, query: np.ndarray, k: int) -> list[dict]:
        """The k images closest to the query, best first: rank, image id, split, score."""
        return [{"rank": r + 1, "image_id": self.image_ids[i], "split": self.splits[i], "score": s}
                for r, (i, s) in enumerate(top_k(self.vectors, query, k))]  # fmt: skip

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


def load_gallery(searcher: Searcher, split: str = "all") -> Gallery:
    """The dataset's images (with features from the model's extractor) and captions, of
    one split or all, embedded by the searcher's model."""
    data = searcher.split(split, with_features=True)
    encoded = encode_split(searcher.model, data, searcher.device)
    rows = {r["image_id"]: r for r in queries.image_rows(searcher.catalog, searcher.dataset, data.image_ids)}
    files = {i: Path(r["path"]) for i, r in rows.items() if r["exists"] and r["path"]}
    texts = queries.caption_texts(searcher.catalog, searcher.dataset, data.caption_ids)
    caption_vectors = _unit(encoded["caption_joint"].cpu().numpy())
    captions = {}
    for index, lang in enumerate(data.languages):
        picked = np.nonzero(data.caption_lang == index)[0]
        ids = [data.caption_ids[r] for r in picked]
        captions[lang] = Captions(ids, [texts.get(c, "") for c in ids],
                                  [data.image_ids[data.caption_image[r]] for r in picked],
                                  np.ascontiguousarray(caption_vectors[picked]))  # fmt: skip
    return Gallery(list(data.image_ids), [rows[i]["split"] if i in rows else "" for i in data.image_ids],
                   _unit(encoded["image"].cpu().numpy()), files, captions)  # fmt: skip


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
