"""What train.patience (and pretrain.patience) would have done to runs already made: for
each run log (a workdir's logs/*-run.log, every epoch's validation in it) and each
patience, the epoch it would stop after, the epoch it would keep and that epoch's
validation score, against the full run. A run with patience is the same model as the full
run up to its stop (mule_core/training/loop.py: the best epoch so far is kept), so this is exact,
not an estimate, and costs no training.

    python bench/patience_from_logs.py LOG [LOG ...] [--patience 1,2,3,4] [--kind joint|lp]
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

LINE = re.compile(r"\b(lp|joint) epoch (\d+)/(\d+): .*?; val ([0-9.]+)")


def histories(path: Path, kind: str) -> list[list[float]]:
    """The validation scores of each `kind` training in the log, in order (a log may hold several)."""
    runs: list[list[float]] = []
    for match in LINE.finditer(path.read_text(errors="replace")):
        if match.group(1) != kind:
            continue
        epoch, score = int(match.group(2)), float(match.group(4))
        if epoch == 1:
            runs.append([])
        if runs and len(runs[-1]) == epoch - 1:
            runs[-1].append(score)
    return runs


def with_patience(scores: list[float], patience: int) -> tuple[int, int, float]:
    """(epochs run, epoch kept, its score) had training stopped after `patience` epochs
    without a better score (0: never)."""
    best, best_epoch = float("-inf"), 0
    for epoch, score in enumerate(scores, start=1):
        if score > best:
            best, best_epoch = score, epoch
        if patience and epoch - best_epoch >= patience and epoch < len(scores):
            return epoch, best_epoch, best
    return len(scores), best_epoch, best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("logs", nargs="+", type=Path)
    parser.add_argument("--patience", default="1,2,3,4")
    parser.add_argument("--kind", default="joint", choices=("joint", "lp"))
    args = parser.parse_args()
    patiences = [int(p) for p in args.patience.split(",")]
    print(f"| run ({args.kind}) | full: epochs, kept, val | " + " | ".join(f"patience {p}" for p in patiences) + " |")
    print("|---|---|" + "---|" * len(patiences))
    for path in args.logs:
        for index, scores in enumerate(histories(path, args.kind)):
            full = with_patience(scores, 0)
            cells = []
            for p in patiences:
                run, kept, score = with_patience(scores, p)
                same = "same model" if kept == full[1] else f"kept {kept}, {score - full[2]:+.2f}"
                cells.append(f"{run} epochs, {same}")
            name = path.name + (f" #{index + 1}" if index else "")
            print(f"| {name} | {full[0]}, {full[1]}, {full[2]:.2f} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
