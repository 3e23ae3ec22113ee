"""Reading a pretrained .vec of fastText's cc.<lang>.300 shape for a vocabulary: seconds and
peak memory, streamed (only the vocabulary's words kept, as the text stage reads it) and
whole (every word kept, as it was read before).

    python bench/vector_file.py [--words 2000000] [--dim 300] [--vocab 5000] [--file PATH]

The synthetic file (random words and 4-decimal values: the size of cc.<lang>.300.vec at
2M words, ~4.5 GB) is written once to --file and reused. Each reading runs in its own
process (peak RSS from getrusage).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

READ = r"""
import resource, sys, time
from mule.datasets.vector_files import VectorFile
path, vocab, total = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
words = None if vocab == 0 else {f"w{i:07d}" for i in range(0, total, max(1, total // vocab))}
started = time.perf_counter()
found = VectorFile(path, words=words)
print(time.perf_counter() - started, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, len(found._table), found.lines)
"""


def write(path: Path, words: int, dim: int) -> None:
    rng = np.random.default_rng(0)
    started = time.perf_counter()
    with open(path, "w") as out:
        out.write(f"{words} {dim}\n")
        for start in range(0, words, 20_000):
            block = rng.standard_normal((min(20_000, words - start), dim)).astype(np.float32)
            lines = [f"w{start + i:07d} " + " ".join(f"{v:.4f}" for v in row) for i, row in enumerate(block)]
            out.write("\n".join(lines) + "\n")
            print(f"\r  writing {path}: {start + len(block):,}/{words:,} words ({time.perf_counter() - started:.0f} s)",
                  end="", flush=True)  # fmt: skip
    print()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--words", type=int, default=2_000_000)
    parser.add_argument("--dim", type=int, default=300)
    parser.add_argument("--vocab", type=int, default=5000)
    parser.add_argument("--file", type=Path, default=Path("/tmp/mule-cc-shape.vec"))
    parser.add_argument("--skip-whole", action="store_true", help="do not also read every word (it needs GBs)")
    args = parser.parse_args()
    if not args.file.exists():
        write(args.file, args.words, args.dim)
    total = int(args.file.open().readline().split()[0])
    print(f"{args.file}: {args.file.stat().st_size / 2**30:.2f} GB")
    print("| reading | words kept | seconds | peak RSS MB |\n|---|---|---|---|")
    for label, vocab in [("streamed, vocabulary only", args.vocab), *([] if args.skip_whole else [("every word", 0)])]:
        done = subprocess.run([sys.executable, "-c", READ, str(args.file), str(vocab), str(total)], capture_output=True, text=True)
        if done.returncode:
            print(f"| {label} | failed: {done.stderr.strip().splitlines()[-1]} | | |")
            continue
        seconds, peak, kept, lines = done.stdout.split()
        print(f"| {label} | {int(kept):,} of {int(lines) - 1:,} | {float(seconds):.1f} | {float(peak):.0f} |", flush=True)


if __name__ == "__main__":
    main()
