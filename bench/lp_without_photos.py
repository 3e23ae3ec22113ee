"""LP on all the training text except the captions of the photographed images: the LP a
fold protocol can use without having read any held-out fold's captions.

    python bench/lp_without_photos.py --workdir W --dataset multi30k --inputs lite0.pt --out lp-clean.pt

The pretrain stage's LP reads every training caption, those of the photos the folds hold
out included (text only, but their cross-lingual alignment is then learned). This runs the
same LP (the resolved config, LP's epoch chosen on the validation split's captions) on the
training split without the images that have features in --inputs (a file of
bench/train_on_workdir.py --export), and writes its weights for bench/photo_folds.py
(a row's "lp": "file", "lp_file": "lp-clean.pt").
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch
import train_on_workdir
from checkout import use_checkout  # noqa: E402

use_checkout()  # run from anywhere, installed or not

from mule.config.overrides import parse_assignments  # noqa: E402
from mule.config.resolution import resolve  # noqa: E402
from mule.data_catalog.splits import load_split, load_vocabulary  # noqa: E402
from mule.data_catalog.tables import Catalog  # noqa: E402
from mule.mule_core.devices import resolve_device  # noqa: E402
from mule.storage.workdir import Workdir  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workdir", required=True)
    parser.add_argument("--dataset", default="embedded")
    parser.add_argument("--inputs", required=True, help="the export whose photographed images are left out")
    parser.add_argument("--preset")
    parser.add_argument("--set", dest="assignments", action="append", default=[])
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    cfg = resolve(args.preset, {"data.dataset": args.dataset, **parse_assignments(args.assignments)})
    catalog = Catalog(Workdir.at(args.workdir))
    vocabulary = load_vocabulary(catalog, args.dataset, cfg.data.languages, cfg.model)
    train = load_split(catalog, args.dataset, "train", vocabulary, cfg.text.max_tokens, None, cfg.data.captions)
    val = load_split(catalog, args.dataset, "val", vocabulary, cfg.text.max_tokens)
    photographed = set(torch.load(args.inputs, map_location="cpu", weights_only=False)["splits"]["train"]["image_ids"])
    keep = np.array([image not in photographed for image in train.image_ids])
    kept = train.only_images(keep)
    print(f"LP on {kept.n_images} of {train.n_images} training images ({len(kept.caption_image)} captions): "
          f"the {int((~keep).sum())} photographed ones and their captions left out", flush=True)  # fmt: skip
    data = {"languages": vocabulary.languages, "vocab_sizes": vocabulary.sizes, "vectors": vocabulary.vectors,
            "words": vocabulary.words, "ngram_vectors": vocabulary.ngram_vectors or {},
            "ngram_lengths": vocabulary.ngram_lengths}  # fmt: skip
    started = time.perf_counter()
    torch.manual_seed(cfg.train.seed)
    state = train_on_workdir.run_lp(cfg, data, kept, val, resolve_device(cfg.train.device), "LP without photos")
    torch.save(state, args.out)
    print(f"wrote {args.out} in {time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
