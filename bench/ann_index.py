"""The gallery index (data_catalog.ann: FAISS HNSW-SQ8 and IVF-SQ8) against the exact
scan, on simulated galleries: build time, index size, resident memory of the index read
back as mule serve reads it (memory-mapped), one-query latency, recall@10.

    python bench/ann_index.py [--sizes 100k:128,1M:128,1M:512,10M:128] [--kinds hnsw-sq8,ivf-sq8]
                              [--queries 300] [--spread 1.0]

Simulated vectors: unit vectors around n/100 random centres (`--spread` is the noise's
norm relative to its centre's: 1.0 puts a vector at cosine ~0.7 from its centre), the
kind of clustered cloud a trained embedding makes of a photo collection; queries are
drawn the same way. On a structureless cloud (--spread 2 or more: every vector nearly
orthogonal to every other) no inverted file finds the exact neighbours cheaply; the
docs say so. The exact top-10 comes from a chunked matrix product (never a second copy
of the gallery). Latency: one query at a time, as `mule serve` asks, median and p99.
"""

from __future__ import annotations

import argparse
import os
import resource
import tempfile
import time

import numpy as np

from mule.data_catalog import ann


def parse_size(text: str) -> tuple[int, int]:
    count, dim = text.split(":")
    scale = {"k": 1_000, "M": 1_000_000}.get(count[-1], 1)
    return int(float(count.rstrip("kM")) * scale), int(dim)


def simulate(n: int, dim: int, centres: np.ndarray, rng: np.random.Generator, spread: float) -> np.ndarray:
    out = np.empty((n, dim), np.float32)
    sigma = np.float32(spread / np.sqrt(dim))
    for start in range(0, n, 500_000):
        m = min(500_000, n - start)
        x = centres[rng.integers(0, len(centres), m)] + rng.standard_normal((m, dim), dtype=np.float32) * sigma
        out[start : start + m] = x / np.linalg.norm(x, axis=1, keepdims=True)
    return out


def exact_top(vectors: np.ndarray, queries: np.ndarray, k: int) -> tuple[np.ndarray, float]:
    """(the exact top-k rows per query, seconds per query of the scan one query at a time)."""
    best_scores = np.full((len(queries), k), -np.inf, np.float32)
    best_rows = np.zeros((len(queries), k), np.int64)
    for start in range(0, len(vectors), 1_000_000):
        scores = queries @ vectors[start : start + 1_000_000].T
        top = np.argpartition(-scores, k - 1, axis=1)[:, :k]
        merged_scores = np.concatenate([best_scores, np.take_along_axis(scores, top, 1)], axis=1)
        merged_rows = np.concatenate([best_rows, top + start], axis=1)
        order = np.argsort(-merged_scores, axis=1)[:, :k]
        best_scores, best_rows = np.take_along_axis(merged_scores, order, 1), np.take_along_axis(merged_rows, order, 1)
    started = time.perf_counter()
    for q in queries[:20]:  # the flat scan `mule serve` does below the threshold
        scores = vectors @ q
        np.argpartition(-scores, k - 1)[:k]
    return best_rows, (time.perf_counter() - started) / 20


def rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def one(n: int, dim: int, kinds: list[str], queries: int, spread: float, seed: int = 0) -> list[dict]:
    import faiss

    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((max(100, n // 100), dim), dtype=np.float32)
    centres /= np.linalg.norm(centres, axis=1, keepdims=True)
    vectors = simulate(n, dim, centres, rng, spread)
    asked = simulate(queries, dim, centres, rng, spread)
    exact, scan_s = exact_top(vectors, asked, 10)
    out = []
    for kind in kinds:
        started = time.perf_counter()

        def progress(done: int, total: int, kind: str = kind, started: float = started) -> None:
            rate = done / max(1e-9, time.perf_counter() - started)
            print(f"\r  {kind} {n:,} x {dim}: added {done:,}/{total:,} ({rate:,.0f}/s, ETA {(total - done) / rate:.0f} s)",
                  end="", flush=True)  # fmt: skip

        index = ann.build(vectors, kind, progress=progress)
        build_s = time.perf_counter() - started
        print()
        default = ann.breadth(index)
        with tempfile.TemporaryDirectory() as folder:
            path = os.path.join(folder, "index.faiss")
            faiss.write_index(index, path)
            size = os.path.getsize(path)
            del index
            before = rss_mb()
            index = faiss.read_index(path, faiss.IO_FLAG_MMAP_IFC | faiss.IO_FLAG_READ_ONLY)  # as mule serve reads it
            loaded = rss_mb() - before
            rows = []
            for breadth in (default // 2, default, default * 2):
                times, found = [], []
                for q in asked:
                    t = time.perf_counter()
                    _, r = ann.search(index, q, 10, breadth)
                    times.append(time.perf_counter() - t)
                    found.append(r[0])
                rows.append({"breadth": breadth, "recall@10": ann.recall_at(exact, np.array(found)),
                             "p50 ms": 1000 * float(np.median(times)), "p99 ms": 1000 * float(np.quantile(times, 0.99))})  # fmt: skip
            queried = rss_mb() - before
            out.append({"kind": kind, "n": n, "dim": dim, "build s": build_s, "index MB": size / 2**20,
                        "float32 MB": n * dim * 4 / 2**20, "rss loaded MB": loaded, "rss queried MB": queried,
                        "scan ms": 1000 * scan_s, "default": default, "rows": rows})  # fmt: skip
            del index
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="100k:128,1M:128,1M:512,10M:128")
    parser.add_argument("--kinds", default="hnsw-sq8,ivf-sq8")
    parser.add_argument("--queries", type=int, default=300)
    parser.add_argument("--spread", type=float, default=1.0)
    args = parser.parse_args()
    import faiss

    print(f"faiss {faiss.__version__}, {faiss.omp_get_max_threads()} threads, {os.cpu_count()} cores; spread {args.spread}")
    lines = ["| index | vectors | dim | build s | file MB (float32 MB) | RSS loaded / after queries MB | exact scan ms | "
             "breadth | recall@10 | p50 ms | p99 ms |", "|---|---|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for size in args.sizes.split(","):
        for r in one(*parse_size(size), args.kinds.split(","), args.queries, args.spread):
            for row in r["rows"]:
                mark = "**" if row["breadth"] == r["default"] else ""
                lines.append(f"| {r['kind']} | {r['n']:,} | {r['dim']} | {r['build s']:.1f} | {r['index MB']:.0f} "
                             f"({r['float32 MB']:.0f}) | {r['rss loaded MB']:.0f} / {r['rss queried MB']:.0f} | "
                             f"{r['scan ms']:.1f} | {mark}{row['breadth']}{mark} | {row['recall@10']:.3f} | "
                             f"{row['p50 ms']:.2f} | {row['p99 ms']:.2f} |")  # fmt: skip
            print("\n".join(lines[-len(r["rows"]) :]), flush=True)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**10
    print("\n" + "\n".join(lines))
    print(f"\npeak RSS of the whole bench {peak:.0f} MB (the simulated gallery itself included)")


if __name__ == "__main__":
    main()
