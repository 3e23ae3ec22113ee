"""What a resumed `mule embed` reads to learn which ids a store holds: LanceDB's ids alone
(serving/vector_stores.py) against the whole table, vectors included (what it read before),
side by side in one sitting, alternated (whole, ids, whole, ids, ...), each read in a
fresh process so that its peak memory is its own.

    python bench/store_resume.py [--rows 200000] [--dim 128] [--repeat 3]

Prints the CPU, each way's seconds (median of the repeats; the files are in the page
cache after the first read) and how much the process's peak resident set grew while
reading (/proc/self/statm sampled every 2 ms, against before it).
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
from stage_times import cpu_model  # bench/ is on the path

WAYS = ("whole table (to_arrow)", "ids alone")


def read_once(folder: str, way: str) -> None:
    """In a fresh process: one way's read, then its seconds and the peak's growth as JSON."""
    import lancedb

    from mule.serving.vector_stores import _lance_ids

    table = lancedb.connect(folder).open_table("images")
    page = resource.getpagesize()

    def resident() -> int:
        return int(Path("/proc/self/statm").read_text().split()[1]) * page

    before, peak, reading = resident(), [0], threading.Event()

    def sample() -> None:  # the resident set every 2 ms while the read runs: its peak
        while not reading.is_set():
            peak[0] = max(peak[0], resident())
            time.sleep(0.002)

    sampler = threading.Thread(target=sample)
    sampler.start()
    started = time.perf_counter()
    ids = table.to_arrow().column("id").to_pylist() if way == WAYS[0] else _lance_ids(table)
    seconds = time.perf_counter() - started
    reading.set()
    sampler.join()
    print(json.dumps({"seconds": seconds, "grew_mib": max(peak[0], resident()) / 2**20 - before / 2**20, "ids": len(ids)}))


def build(folder: Path, rows: int, dim: int) -> None:
    import lancedb

    db = lancedb.connect(str(folder))
    rng = np.random.default_rng(0)
    for start in range(0, rows, 50_000):
        n = min(50_000, rows - start)
        vectors = rng.normal(size=(n, dim)).astype(np.float32)
        batch = pa.table({"id": [f"photos/{i:08d}.jpg" for i in range(start, start + n)],
                          "vector": pa.FixedSizeListArray.from_arrays(pa.array(vectors.reshape(-1)), dim)})  # fmt: skip
        if start == 0:
            table = db.create_table("images", batch)
        else:
            table.add(batch)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--read", nargs=2, metavar=("FOLDER", "WAY"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.read:
        return read_once(*args.read)

    import lancedb

    folder = Path(tempfile.mkdtemp(prefix="store-resume-"))
    build(folder, args.rows, args.dim)
    size = sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())
    print(f"CPU: {cpu_model()}; LanceDB {lancedb.__version__}; {args.rows:,} rows of {args.dim}-d float32 "
          f"({size / 2**20:,.0f} MiB on disk)")  # fmt: skip
    found: dict[str, list[dict]] = {way: [] for way in WAYS}
    for _ in range(args.repeat):
        for way in WAYS:
            done = subprocess.run([sys.executable, __file__, "--read", str(folder), way], capture_output=True,
                                  text=True, check=True)  # fmt: skip
            result = json.loads(done.stdout.strip().splitlines()[-1])
            assert result["ids"] == args.rows
            found[way].append(result)
            print(f"  {way}: {result['seconds']:.3f} s, peak resident set +{result['grew_mib']:,.0f} MiB")
    for way in WAYS:
        print(f"median {way}: {statistics.median(r['seconds'] for r in found[way]):.3f} s, "
              f"+{statistics.median(r['grew_mib'] for r in found[way]):,.0f} MiB")  # fmt: skip


if __name__ == "__main__":
    main()
