"""How near its own vector a word outside the vocabulary is composed from character n-grams:
a language's commonest words (wordfreq) read by multilingual-e5 (centred on its 1,000
commonest, as the aligned start reads them), the rarest `--held` left out, the n-gram table
fitted on the rest two ways, and each held-out word composed from its known n-grams and
ranked against every held-out word's own vector (rank 1: its own is the nearest).

- ridge: fit_ngram_means, ridge least squares by conjugate gradients (what mule does);
- mean: each n-gram the mean of the words that hold it (the plain way).

    python bench/unseen_words.py --lang es --words 50000 --held 5000 [--workdir W]

With --workdir (a workdir whose train stage ran) the vectors are the ones an added
language starts from (words/aligned.py: each word its nearest trained words'
MULE features), not e5's own.

Words are read by e5 once per machine (the user's cache: words/vectors.py).
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np
import torch
from stage_times import cpu_model  # bench/ is on the path

from mule.data_catalog.model_files import load_model
from mule.mule_core.subwords import NgramTable
from mule.storage.workdir import Workdir
from mule.words import vectors as e5_words
from mule.words.aligned import StartSettings, aligned_start
from mule.words.arithmetic import fit_ngram_means
from mule.words.common import MEAN_WORDS, common_words


def mean_table(index: torch.Tensor, targets: torch.Tensor, rows: int) -> torch.Tensor:
    """Each n-gram the mean of the targets of the words that hold it."""
    held = index.reshape(-1).long()
    owner = torch.arange(index.shape[0]).repeat_interleave(index.shape[1])
    keep = held > 0
    sums = torch.zeros(rows, targets.shape[1]).index_add_(0, held[keep], targets[owner[keep]])
    counts = torch.zeros(rows).index_add_(0, held[keep], torch.ones(int(keep.sum())))
    table = sums / counts.clamp(min=1)[:, None]
    table[0].zero_()
    return table


def ranks(table: NgramTable, fitted: torch.Tensor, words: list[str], own: torch.Tensor) -> tuple[np.ndarray, float, int]:
    """Each word's rank of its own vector among `own` by cosine to its composed vector, the
    mean cosine to its own, and how many words share no n-gram with the table (<unk>)."""
    rows = table.rows(words).long()
    present = (rows > 0).float()
    composed = (fitted[rows] * present[..., None]).sum(1) / present.sum(1).clamp(min=1)[:, None]
    unknown = int((present.sum(1) == 0).sum())
    composed = composed / composed.norm(dim=1, keepdim=True).clamp(min=1e-12)
    target = own / own.norm(dim=1, keepdim=True)
    scores = composed @ target.T
    mine = scores.diagonal()
    return (1 + (scores > mine[:, None]).sum(1)).numpy(), float(mine.mean()), unknown


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lang", default="es")
    parser.add_argument("--words", type=int, default=50000)
    parser.add_argument("--held", type=int, default=5000, help="the rarest this many left out")
    parser.add_argument("--lengths", default="3,4,5", help="model.ngram_lengths")
    parser.add_argument("--workdir", help="read the aligned start's vectors of this workdir's model instead of e5's")
    parser.add_argument("--dataset", default="multi30k")
    args = parser.parse_args()
    words = common_words(args.lang, args.words)
    if args.workdir:
        model, meta = load_model(Workdir.at(args.workdir).model_path(args.dataset, "model"))
        if args.lang in model.languages:
            raise SystemExit(f"{args.lang} is one of the model's trained languages: name a language to add")
        start = aligned_start(model, meta["vocabulary"], args.lang, [], StartSettings(open_words=args.words),
                              meta["cfg"].text.tokenizers)
        assert start.vocab.tokens[2:] == words
        vectors, what = start.vectors[2:].float(), "the aligned start's vectors"
    else:
        vectors = torch.from_numpy(e5_words.word_vectors(words, f"e5 words ({args.lang})")).float()
        vectors, what = vectors - vectors[:MEAN_WORDS].mean(0), "e5's vectors"
    seen, unseen = words[: -args.held], words[-args.held :]
    table = NgramTable(seen, [int(n) for n in args.lengths.split(",")])
    print(f"CPU: {cpu_model()}, {os.cpu_count()} cores; {args.lang}: {len(seen)} words fitted, {len(table)} n-grams, "
          f"the rarest {len(unseen)} held out; {what}; chance: median rank {(len(unseen) + 1) / 2:.0f}")  # fmt: skip
    print("| n-gram table | median rank | ranked first | in the first 10 | mean cosine | <unk> | seconds |\n"
          "|---|---|---|---|---|---|---|")
    for name, fit in (("ridge (mule)", lambda: fit_ngram_means(table.index.long(), vectors[: len(seen)], len(table) + 1)),
                      ("mean of its words", lambda: mean_table(table.index.long(), vectors[: len(seen)], len(table) + 1))):  # fmt: skip
        started = time.perf_counter()
        fitted = fit()
        seconds = time.perf_counter() - started
        rank, cosine, unknown = ranks(table, fitted, unseen, vectors[len(seen) :])
        print(f"| {name} | {np.median(rank):.0f} | {np.mean(rank == 1):.1%} | {np.mean(rank <= 10):.1%} | "
              f"{cosine:.3f} | {unknown} | {seconds:.1f} |", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
