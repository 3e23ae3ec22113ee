"""Whether the generated dataset's val and test captions hold words its training captions
lack (those would get no vocabulary row: issue 43), at any size.

    python bench/generated_vocabulary.py [--train-images 29000 --val-images 1014 --test-images 1000]

Generates the captions only (no image is drawn) and tokenises them as ingest does.
"""

from __future__ import annotations

import argparse
import time
from collections import defaultdict

from mule.generators.multi30k_layout import EmbeddedSpec, generate_image
from mule.mule_core.vocabulary import tokenize


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--train-images", type=int, default=29000)
    parser.add_argument("--val-images", type=int, default=1014)
    parser.add_argument("--test-images", type=int, default=1000)
    args = parser.parse_args()
    spec = EmbeddedSpec(train_images=args.train_images, val_images=args.val_images, test_images=args.test_images)
    words: dict[str, dict[str, set]] = defaultdict(lambda: defaultdict(set))
    started = time.perf_counter()
    for split, n in spec.sizes().items():
        for index in range(1, n + 1):
            _, task2, task1, _ = generate_image(spec, split, index)
            for lang, captions in task2.items():
                for caption in captions:
                    words[lang][split].update(tokenize(caption, lang))
            for lang, caption in task1.items():
                words[lang][split].update(tokenize(caption, lang))
    print(f"{spec.sizes()}; {time.perf_counter() - started:.0f} s\n")
    print("| lang | training words | val words outside them | test words outside them |")
    print("|---|---|---|---|")
    for lang, by_split in words.items():
        outside = {s: sorted(by_split[s] - by_split["train"]) for s in ("val", "test")}
        print(f"| {lang} | {len(by_split['train'])} | {len(outside['val'])} | {len(outside['test'])} |")


if __name__ == "__main__":
    main()
