"""The zero-shot peer on a workdir's test splits, language by language: the bundled
multilingual-e5-small (frozen, "query: " prefix) embeds the captions, and a ridge map from
the workdir's image features into e5's space is fitted on English captions of the training
photos. e5 is multilingual, so the same map is queried in every language without a caption
of it: the row a new language of mule's is compared with (docs/real-photos.md).

    python bench/peer_xflickrco.py --workdir W --dataset multi30k \
        [--splits test_xflickrco,test_2016] [--languages en,de,...] [--captions-per-image 2] [--out peer.json]

The features are the champion's (models/<dataset>/<--model>.pt names its extractor); the
ridge strength is chosen on the val split's English captions (mR), then the map is refitted
on every training photo. Every split is ranked over its photographed images; chance beside
it. e5's vectors are cached beside the workdir's results, so a rerun prints at once.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import platform
import time
from pathlib import Path

import numpy as np
import torch
from checkout import use_checkout  # noqa: E402

use_checkout()  # run from anywhere, installed or not

from photo_folds import RIDGE_STRENGTHS, e5_vectors, fit_ridge, peer_measure  # noqa: E402

from mule.config.resolution import resolve  # noqa: E402
from mule.data_catalog import queries  # noqa: E402
from mule.data_catalog.model_files import load_model  # noqa: E402
from mule.data_catalog.splits import load_split, load_vocabulary  # noqa: E402
from mule.data_catalog.tables import Catalog  # noqa: E402
from mule.mule_core.metrics import chance_table, mean_mr  # noqa: E402
from mule.storage.workdir import Workdir  # noqa: E402


def english_only(split, per_image: int):
    """The split with only its first `per_image` English captions of each image (their order
    in the catalog): what the map is fitted on."""
    en = split.languages.index("en")
    seen: dict[int, int] = {}
    rows = []
    for row, (lang, image) in enumerate(zip(split.caption_lang, split.caption_image)):
        if lang == en and seen.get(int(image), 0) < per_image:
            seen[int(image)] = seen.get(int(image), 0) + 1
            rows.append(row)
    index = np.asarray(rows)
    return dataclasses.replace(split, tokens=split.tokens[torch.from_numpy(index)],
                               lengths=split.lengths[torch.from_numpy(index)], caption_lang=split.caption_lang[index],
                               caption_image=split.caption_image[index],
                               caption_ids=[split.caption_ids[r] for r in rows],
                               caption_group=None, unseen=None)  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workdir", required=True)
    parser.add_argument("--dataset", default="multi30k")
    parser.add_argument("--model", default="model", help="whose image features (models/<dataset>/<model>.pt)")
    parser.add_argument("--splits", default="test_xflickrco,test_2016")
    parser.add_argument("--languages", default="en,de,fr,cs,es,id,ja,ru,zh", help="the catalog's, with word vectors")
    parser.add_argument("--captions-per-image", type=int, default=2, help="English captions of a training photo fitted")
    parser.add_argument("--out", help="write the tables as JSON here")
    args = parser.parse_args()

    wd = Workdir.at(args.workdir)
    catalog = Catalog(wd)
    _, meta = load_model(wd.model_path(args.dataset, args.model))
    languages = args.languages.split(",")
    cfg = resolve(None, {"data.dataset": args.dataset, "data.languages": ",".join(languages)})
    vocabulary = load_vocabulary(catalog, args.dataset, languages, cfg.model)

    def split(selector: str):
        return load_split(catalog, args.dataset, selector, vocabulary, cfg.text.max_tokens, meta["extractor"])

    cache = wd.results_dir(args.dataset)
    started = time.perf_counter()
    train = english_only(split("train"), args.captions_per_image)
    val = english_only(split("val"), 5)
    vectors = e5_vectors(args.workdir, args.dataset, train.caption_ids + val.caption_ids, cache / "peer-e5-fit.npy")
    scores = {s: mean_mr(peer_measure(fit_ridge(train, vectors, s), val, vectors)) for s in RIDGE_STRENGTHS}
    strength = max(scores, key=scores.get)
    ridge = fit_ridge(train, vectors, strength)
    print(f"{platform.processor() or platform.machine()}, {torch.get_num_threads()} threads; ridge fitted on "
          f"{len(train.caption_ids)} English captions of {train.n_images} training photos; strength {strength:g} "
          f"chosen on {val.n_images} val photos (val mR {', '.join(f'{k:g}: {v:.1f}' for k, v in scores.items())})")  # fmt: skip
    out = {"strength": strength, "val_scores": scores, "fitted_captions": len(train.caption_ids), "splits": {}}
    for selector, name in queries.evaluation_splits(catalog, args.dataset, args.splits):
        held = split(selector)
        held_vectors = e5_vectors(args.workdir, args.dataset, held.caption_ids, cache / f"peer-e5-{name}.npy")
        table = peer_measure(ridge, held, held_vectors)
        chance = chance_table(torch.from_numpy(held.caption_image), torch.from_numpy(held.caption_lang),
                              held.languages, (1, 5, 10))  # fmt: skip
        out["splits"][name] = {"images": held.n_images, "table": table, "chance": chance}
        print(f"\n{name}: {held.n_images} photographed images (mR; chance beside)")
        print("| | " + " | ".join(table) + " |\n|---|" + "---|" * len(table))
        print("| e5-small + ridge | " + " | ".join(f"{row['mR']:.1f}" for row in table.values()) + " |")
        print("| chance | " + " | ".join(f"{chance[lang]['mR']:.1f}" for lang in table) + " |")
    print(f"\n{time.perf_counter() - started:.0f} s")
    if args.out:
        Path(args.out).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
