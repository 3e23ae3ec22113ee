"""The embedded dataset's ceiling: what a model that knew every scene and every caption's
meaning perfectly would score on its test split (embedded.ceiling).

    python bench/embedded_ceiling.py [--test-images N] [--seed S]
"""

from __future__ import annotations

import argparse
import time

from mule.generators.ceiling import ceiling
from mule.generators.multi30k_layout import EmbeddedSpec

COLUMNS = ("i2t_r1", "i2t_r5", "i2t_r10", "t2i_r1", "t2i_r5", "t2i_r10", "mR")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--test-images", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    started = time.perf_counter()
    table = ceiling(EmbeddedSpec(test_images=args.test_images, seed=args.seed))
    print(f"ceiling of the embedded test split ({args.test_images} images, seed {args.seed}), "
          f"{time.perf_counter() - started:.1f}s\n")  # fmt: skip
    print("| lang | img->txt R@1 | R@5 | R@10 | txt->img R@1 | R@5 | R@10 | mR |")
    print("|---|---|---|---|---|---|---|---|")
    for lang, row in table.items():
        print(f"| {lang} | " + " | ".join(f"{row[c]:.1f}" for c in COLUMNS) + " |")
    print(f"\nmean mR over languages: {sum(r['mR'] for r in table.values()) / len(table):.1f}")


if __name__ == "__main__":
    main()
