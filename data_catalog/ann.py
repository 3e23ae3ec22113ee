"""Approximate nearest neighbours over a gallery's unit vectors (cosine = inner product),
with FAISS: what the index stage builds and `mule serve` searches (data_catalog.index_files
keeps its files). Two kinds, both storing a vector as one byte per dimension (8-bit
scalar quantisation: a quarter of float32):

- hnsw-sq8 (the default): a navigable small-world graph (32 links a vector). The best
  recall for the time here (recall@10 0.98 in 0.25 ms at 1M x 128, 0.96 in 0.8 ms at
  1M x 512), at the price of a slower build (3 and 5 min on 2 cores) and 256 bytes of
  links a vector, read into memory (FAISS does not map a graph).
- ivf-sq8: k-means cells, a query scans the `breadth` closest. Builds 15x faster and
  adds nothing to the vectors' bytes, but needs many cells scanned where neighbours
  straddle cells (bench/ann_index.py: 0.83 at 1M x 128 with 64 of 2048 cells); its lists are
  read memory-mapped.

The search breadth (HNSW's efSearch, IVF's nprobe) is set at query time, without
rebuilding. data_catalog.index_files keeps the files.

    index = build(vectors)                      # (n, dim) float32, unit rows
    scores, rows = search(index, queries, k)    # best first; rows -1 when fewer than k
"""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np

KINDS = ("hnsw-sq8", "ivf-sq8", "flat")
HNSW_LINKS = 32  # M: links per vector (FAISS's and the HNSW paper's usual 16-48)
HNSW_BUILD_BREADTH = 64  # efConstruction
HNSW_SEARCH_BREADTH = 128  # efSearch: recall@10 0.98 at 1M x 128, 0.96 at 1M x 512 (bench/ann_index.py)


def cells_for(n: int) -> int:
    """The number of k-means cells: about 4 sqrt(n) (FAISS's guideline), a power of two,
    with at least 39 training points each."""
    cells = 1 << max(0, int(np.log2(max(1.0, 4 * np.sqrt(n)))))
    return max(1, min(cells, n // 39))


def probes_for(cells: int) -> int:
    """Cells scanned per query: 1/32 of them, at least 8 (recall@10 >= 0.95 in bench/ann_index.py)."""
    return max(1, min(cells, max(8, cells // 32)))


def build(vectors: np.ndarray, kind: str = "hnsw-sq8", cells: int = 0, seed: int = 0, add_batch: int = 262_144,
          progress: Callable[[int, int], None] | None = None):  # fmt: skip
    """The index of `vectors` (n, dim), rows numbered 0..n-1 as given. cells (ivf-sq8):
    0 picks cells_for(n). progress(done, n) is called after each batch added."""
    import faiss

    vectors = np.ascontiguousarray(vectors, dtype=np.float32)
    n, dim = vectors.shape
    if kind not in KINDS:
        raise ValueError(f"index kind {kind!r}: one of {', '.join(KINDS)}")
    if kind == "flat" or n < 2 * 39:
        index = faiss.IndexFlatIP(dim)
    elif kind == "hnsw-sq8":
        index = faiss.IndexHNSWSQ(dim, faiss.ScalarQuantizer.QT_8bit, HNSW_LINKS, faiss.METRIC_INNER_PRODUCT)
        index.hnsw.efConstruction = HNSW_BUILD_BREADTH
        index.hnsw.efSearch = HNSW_SEARCH_BREADTH
        rng = np.random.default_rng(seed)
        index.train(vectors[np.sort(rng.choice(n, size=min(n, 65_536), replace=False))])  # the quantiser's ranges
    else:
        cells = cells or cells_for(n)
        quantizer = faiss.IndexFlatIP(dim)
        index = faiss.IndexIVFScalarQuantizer(quantizer, dim, cells, faiss.ScalarQuantizer.QT_8bit,
                                              faiss.METRIC_INNER_PRODUCT)  # fmt: skip
        index.cp.seed = seed
        rng = np.random.default_rng(seed)
        sample = vectors[np.sort(rng.choice(n, size=min(n, 64 * cells), replace=False))]
        index.train(sample)
        index.nprobe = probes_for(cells)
    for start in range(0, n, add_batch):
        index.add(vectors[start : start + add_batch])
        if progress:
            progress(min(n, start + add_batch), n)
    return index


def search(index, queries: np.ndarray, k: int, breadth: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """(scores, rows), each (m, k), best first. breadth: HNSW's efSearch or IVF's nprobe
    for this search (0: the index's own)."""
    import faiss

    queries = np.ascontiguousarray(np.atleast_2d(queries), dtype=np.float32)
    if breadth and hasattr(index, "nprobe"):
        return index.search(queries, k, params=faiss.SearchParametersIVF(nprobe=breadth))
    if breadth and hasattr(index, "hnsw"):
        return index.search(queries, k, params=faiss.SearchParametersHNSW(efSearch=max(breadth, k)))
    return index.search(queries, k)


def set_breadth(index, breadth: int) -> None:
    """The index's own search breadth from now on (HNSW's efSearch, IVF's nprobe)."""
    if hasattr(index, "nprobe"):
        index.nprobe = breadth
    elif hasattr(index, "hnsw"):
        index.hnsw.efSearch = breadth


def default_breadth(index) -> int:
    """This version's default search breadth for the index's kind (an index file keeps the
    breadth it was built with; the default may have moved since)."""
    if hasattr(index, "nlist"):
        return probes_for(int(index.nlist))
    return HNSW_SEARCH_BREADTH if hasattr(index, "hnsw") else 0


def breadth(index) -> int:
    if hasattr(index, "nprobe"):
        return int(index.nprobe)
    return int(index.hnsw.efSearch) if hasattr(index, "hnsw") else 0


def describe(index) -> dict:
    """What kind of index this is, for people and for the record."""
    base = {"vectors": int(index.ntotal), "dim": int(index.d)}
    if hasattr(index, "nlist"):
        return {"kind": "ivf-sq8", **base, "cells": int(index.nlist), "breadth": int(index.nprobe)}
    if hasattr(index, "hnsw"):
        return {"kind": "hnsw-sq8", **base, "links": HNSW_LINKS, "breadth": int(index.hnsw.efSearch)}
    return {"kind": "flat", **base}


def recall_at(exact_rows: np.ndarray, found_rows: np.ndarray) -> float:
    """Share of the exact top-k found by the approximate top-k (recall@k against the scan)."""
    hits = sum(len(set(e.tolist()) & set(f.tolist())) for e, f in zip(exact_rows, found_rows))
    return hits / exact_rows.size


def timed(function, *args, **kwargs):
    started = time.perf_counter()
    result = function(*args, **kwargs)
    return result, time.perf_counter() - started
