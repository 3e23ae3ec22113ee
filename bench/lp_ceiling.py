"""What limits en->x image-level R@1 on Multi30K: translation or English paraphrase?

    python bench/lp_ceiling.py --inputs in.pt [--seeds 0,1,2] [--set K=V ...]
    python bench/lp_ceiling.py --peer-workdir W     # multilingual-e5-small (bench/peer_e5.py's cache)

Each test image has five English captions; task1 translated one of them (its "source
line") into German, French and Czech, and German also has five independent captions. The
image-level protocol (mule's, AME's) makes every English caption a query, so four of the
five en->fr queries must find the French translation of a *different* English sentence:
paraphrase retrieval across languages. This script splits each en->x R@1 into the source
lines' queries and the other four, and adds the **perfect-translation ceiling**: the same
English queries against the English source lines themselves (one per image; en->fr with a
translation that loses nothing). A model cannot beat its own ceiling by aligning languages
better: only by retrieving English paraphrases better. A TF-IDF bag of words (idf from the
training captions) is the lexical reference.

--inputs: LP trained per seed as `bench/seed_table.py --lp-only` trains it, MULE layer.
Prints one JSON line per seed, then mean ± standard deviation over the seeds.
"""

from __future__ import annotations

import argparse
import json
import platform
import time

import numpy as np
import torch
from checkout import use_checkout  # noqa: E402

use_checkout()  # run from anywhere, installed or not

import train_on_workdir  # noqa: E402

from mule.config.overrides import parse_assignments  # noqa: E402
from mule.config.resolution import resolve  # noqa: E402
from mule.experiments.seeds import mean_spread  # noqa: E402
from mule.mule_core.devices import resolve_device  # noqa: E402
from mule.mule_core.encoding import encode_split  # noqa: E402

SOURCE = "en"


def query_kinds(emb: torch.Tensor, image: torch.Tensor, lang: torch.Tensor, group: torch.Tensor,
                languages: list[str]) -> dict[str, float]:  # fmt: skip
    """R@1 of English queries per target: all, source-line queries, the others; and the
    ceiling (targets: the English source lines). emb L2-normalised; group >= 0 on task1 lines."""
    en = languages.index(SOURCE)
    queries = (lang == en).nonzero().squeeze(1)
    targets = {x: (lang == languages.index(x)).nonzero().squeeze(1) for x in languages if x != SOURCE}
    targets["en source lines (ceiling)"] = ((lang == en) & (group >= 0)).nonzero().squeeze(1)
    out = {}
    for name, candidates in targets.items():
        q = queries[torch.isin(image[queries], image[candidates])]
        best = (emb[q] @ emb[candidates].T).argmax(1)
        hit = (image[candidates][best] == image[q]).double() * 100
        source = group[q] >= 0
        label = name if name.startswith("en ") else f"en->{name}"
        out[f"{label}"] = hit.mean().item()
        out[f"{label}, source-line queries"] = hit[source].mean().item()
        out[f"{label}, other queries"] = hit[~source].mean().item()
    return out


def tfidf(split, train, vocab_size: int, languages: list[str]) -> torch.Tensor:
    """English captions as TF-IDF vectors (idf over the training captions); others zero."""
    en = languages.index(SOURCE)

    def counts(s, rows):
        m = torch.zeros(len(rows), vocab_size)
        for i, r in enumerate(rows):
            tokens = s.tokens[r, : s.lengths[r]]
            m[i].index_add_(0, tokens, torch.ones(len(tokens)))
        return m

    df = torch.zeros(vocab_size, dtype=torch.float64)  # captions per word, one caption at a time
    train_rows = np.nonzero(train.caption_lang == en)[0]
    for r in train_rows:
        df[train.tokens[r, : train.lengths[r]].unique()] += 1
    idf = (torch.log((len(train_rows) + 1) / (df + 1)) + 1).float()
    rows = np.nonzero(split.caption_lang == en)[0]
    emb = torch.zeros(len(split.caption_lang), vocab_size)
    emb[torch.from_numpy(rows)] = torch.nn.functional.normalize(counts(split, rows) * idf, dim=-1)
    return emb


def from_inputs(args) -> None:
    data, splits = train_on_workdir.load_inputs(args.inputs)
    test = splits["test"]
    if test.caption_group is None or not (test.caption_group >= 0).any():
        raise SystemExit(f"{args.inputs}: the test split has no translation groups (task1 lines)")
    languages = list(test.languages)
    image, lang = torch.from_numpy(test.caption_image), torch.from_numpy(test.caption_lang)
    group = torch.from_numpy(test.caption_group)
    sizes = data["vocab_sizes"]
    en_size = sizes[SOURCE] if isinstance(sizes, dict) else sizes[languages.index(SOURCE)]
    lexical = query_kinds(tfidf(test, splits["train"], en_size, languages), image, lang, group, languages)
    print("TF-IDF " + json.dumps({k: round(v, 1) for k, v in lexical.items() if k.startswith("en source")}))
    device = resolve_device(resolve(args.preset, {}).train.device)
    print(f"machine: {platform.node()}, {device}, {torch.get_num_threads()} threads, torch {torch.__version__}")
    by_seed = []
    for seed in [int(s) for s in args.seeds.split(",")]:
        cfg = resolve(args.preset, {"data.dataset": data.get("dataset", "embedded"),
                                    **parse_assignments(args.assignments), "train.seed": seed})  # fmt: skip
        started = time.perf_counter()
        torch.manual_seed(seed)
        model = train_on_workdir.build(cfg, data, None)
        state = train_on_workdir.run_lp(cfg, data, splits["train"], splits["val"], device, f"seed {seed}")
        model.load_state_dict(state, strict=False)
        emb = torch.nn.functional.normalize(encode_split(model, test, device, joint=False)["caption_mule"], dim=-1)
        result = query_kinds(emb.cpu(), image, lang, group, languages)
        by_seed.append(result)
        print(f"seed {seed} ({time.perf_counter() - started:.0f} s) " + json.dumps({k: round(v, 1) for k, v in result.items()}),
              flush=True)  # fmt: skip
    print(f"\nMULE layer, LP, seeds {args.seeds} (mean ± standard deviation):")
    for key in by_seed[0]:
        print(f"  {key:45s} {mean_spread([r[key] for r in by_seed])}")


def from_peer(args) -> None:
    from pathlib import Path

    from mule.data_catalog import queries
    from mule.data_catalog.splits import translation_groups
    from mule.data_catalog.tables import Catalog
    from mule.storage.workdir import Workdir

    catalog = Catalog(Workdir.at(args.peer_workdir))
    cache = Path(args.peer_workdir) / "results" / args.dataset / f"peer-e5-{args.split}.npy"
    if not cache.exists():
        raise SystemExit(f"{cache}: no cached peer vectors; run bench/peer_e5.py --workdir {args.peer_workdir} first")
    rows = queries.caption_selection(catalog, args.dataset, args.split, ["en", "de", "fr", "cs"], "human")
    langs, images = rows["lang"].to_pylist(), rows["image_id"].to_pylist()
    languages = [x for x in ["en", "de", "fr", "cs"] if x in set(langs)]
    index = {img: i for i, img in enumerate(sorted(set(images)))}
    emb = torch.nn.functional.normalize(torch.from_numpy(np.load(cache)).float(), dim=-1)
    if len(emb) != len(langs):
        raise SystemExit(f"{cache}: {len(emb)} vectors for {len(langs)} captions; rerun bench/peer_e5.py")
    result = query_kinds(emb, torch.tensor([index[i] for i in images]), torch.tensor([languages.index(x) for x in langs]),
                         torch.from_numpy(translation_groups(rows["translation_key"].to_pylist())), languages)  # fmt: skip
    print("multilingual-e5-small (peer):")
    for key, value in result.items():
        print(f"  {key:45s} {value:5.1f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--inputs", help="bench/train_on_workdir.py --export --text-only output")
    parser.add_argument("--peer-workdir", help="a workdir where bench/peer_e5.py cached its vectors")
    parser.add_argument("--dataset", default="multi30k")
    parser.add_argument("--split", default="test_2016")
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--preset", help="default: the dataset's (config.resolution.default_preset)")
    parser.add_argument("--set", dest="assignments", action="append", default=[])
    args = parser.parse_args()
    if bool(args.inputs) == bool(args.peer_workdir):
        parser.error("give --inputs or --peer-workdir")
    from_inputs(args) if args.inputs else from_peer(args)


if __name__ == "__main__":
    main()
