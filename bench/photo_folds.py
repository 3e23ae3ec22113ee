"""Settings judged with few photographs: k folds over the training split's photographed
images, several seeds, mean and spread per language with chance beside, then the test
split read once.

    python bench/photo_folds.py --rows rows.json [--folds 5] [--seeds 0,1,2] [--at-epoch E] [--out folds.json]
    python bench/photo_folds.py --rows rows.json --combine a.json b.json [--at-epoch E]   # one table of runs made apart
    python bench/photo_folds.py --rows rows.json --test [--epochs-from folds.json] [--out test.json]

rows.json: {"row name": {"inputs": "file.pt", "set": {"section.option": value},
                         "lp": "inputs" | "photographed" | "none", "peer": "e5-ridge",
                         "texts": "W", "vs": "another row"}, ...}; a row's difference is
          taken from its "vs" row, else from the first row
  inputs  a file from `bench/train_on_workdir.py --workdir W --export file.pt` (its train
          split holds the photographed training images: the ones with features; another
          extractor or vectors.init is another file)
  lp      "inputs": the LP model in the file (the workdir's: LP on all the training text);
          "photographed": LP on each fold's training captions alone, before joint training;
          "none": no LP (pretrain.enabled=false); "file": the LP weights in "lp_file" (from
          bench/lp_without_photos.py: LP on all the text but the photographed captions,
          which no held-out fold's captions reach)
  peer    "e5-ridge": no MULE; the bundled multilingual-e5-small embeds the captions
          (frozen), and a ridge map from the same image features into its space is fitted
          on the fold's training photos, its strength chosen on a fifth of them
          ("texts": the workdir whose catalog holds the captions' text)

The protocol (mule_core.folds): each fold's images are never trained on; a model trains
on the other folds' photos for train.epochs epochs (no epoch is chosen on the fold) and
the held-out fold is measured after every epoch, so the table at epoch E is what E epochs
give. A row's figure is the mean over folds of a seed, then mean ± std over seeds; its
difference from the baseline is paired by seed (experiments/seeds.py: a gain only when
every seed moves the same way by more than the spread). Chance: a random ranking of each
fold's own images and sentences, averaged over folds.

--test trains each row on every photographed training image (train.epochs, or each row's
best epoch count on the folds with --epochs-from) and reads the test split once.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import platform
import sys
import time
from pathlib import Path

import numpy as np
import torch
import train_on_workdir
from checkout import use_checkout  # noqa: E402

use_checkout()  # run from anywhere, installed or not

from mule.config.overrides import parse_assignments  # noqa: E402
from mule.config.resolution import resolve  # noqa: E402
from mule.experiments.seeds import paired_difference  # noqa: E402
from mule.mule_core.devices import resolve_device  # noqa: E402
from mule.mule_core.encoding import evaluate_split  # noqa: E402
from mule.mule_core.folds import FoldRun, cross_validate, fold_of_images, summarize  # noqa: E402
from mule.mule_core.metrics import chance_table, mean_mr, per_language_recalls  # noqa: E402
from mule.mule_core.progress import format_seconds  # noqa: E402
from mule.mule_core.training.joint import JointTrainer  # noqa: E402

RIDGE_STRENGTHS = (1e-1, 1.0, 1e1, 1e2, 1e3, 1e4)


# -- MULE --------------------------------------------------------------------------------
def mule_fitter(cfg_of, data: dict, lp: str, val, device, lp_file: str = ""):
    """fit(train, seed, after_epoch) for a MULE row: LP as the row says, then joint training
    on `train` alone for train.epochs, after_epoch(model) after each epoch."""

    def fit(train, seed: int, after_epoch) -> None:
        cfg = cfg_of(seed)
        torch.manual_seed(seed)
        lp_state = None
        if lp == "inputs":
            lp_state = data["lp_state"]
            if lp_state is None:
                sys.exit("lp=inputs, but the inputs hold no LP model: run `mule run pretrain` before exporting")
        elif lp == "file":  # e.g. bench/lp_without_photos.py: LP that never read a photographed caption
            lp_state = torch.load(lp_file, map_location="cpu", weights_only=False)
        elif lp == "photographed":  # LP's epoch chosen on the validation split's captions (no fold's)
            lp_state = train_on_workdir.run_lp(cfg, data, train, val, device, f"seed {seed} LP")
            torch.manual_seed(seed)
        model = train_on_workdir.build(cfg, data, train.features.shape[1])
        model.set_image_normalization(train.features)
        if lp_state is not None:
            own = {k: v for k, v in lp_state.items() if k.startswith("branches.") or k.startswith("classifier.")}
            model.load_state_dict(own, strict=False)
        trainer = JointTrainer(model, train, cfg.loss, cfg.train, device)  # no validation: no epoch is chosen
        trainer.fit(lambda result: after_epoch(trainer.kept_model))

    def measure(model, held) -> dict:
        return evaluate_split(model, held, device)

    return fit, measure


# -- the peer: frozen multilingual-e5 and a ridge map from the image features ----------------
def e5_vectors(workdir: str, dataset: str, caption_ids: list[str], cache: Path) -> dict[str, np.ndarray]:
    """caption id -> e5's vector of its text (cached by the texts' digest)."""
    from peer_e5 import cached_e5

    from mule.data_catalog import queries
    from mule.data_catalog.tables import Catalog
    from mule.storage.workdir import Workdir

    texts = queries.caption_texts(Catalog(Workdir.at(workdir)), dataset, caption_ids)
    vectors = cached_e5([texts[i] for i in caption_ids], cache, "peer e5")
    return dict(zip(caption_ids, vectors))


def ridge(x: torch.Tensor, y: torch.Tensor, strength: float) -> torch.Tensor:
    """W minimising |xW - y|^2 + strength * n * |W|^2 (x, y centred by the caller)."""
    gram = x.T @ x + strength * len(x) / x.shape[1] * torch.eye(x.shape[1], dtype=x.dtype)
    return torch.linalg.solve(gram, x.T @ y)


@dataclasses.dataclass
class RidgeMap:
    mean: torch.Tensor
    scale: torch.Tensor
    weights: torch.Tensor
    target_mean: torch.Tensor
    strength: float

    def images(self, features: torch.Tensor) -> torch.Tensor:
        mapped = ((features.double() - self.mean) / self.scale) @ self.weights + self.target_mean
        return torch.nn.functional.normalize(mapped.float(), dim=-1)


def fit_ridge(train, vectors: dict[str, np.ndarray], strength: float) -> RidgeMap:
    """One row per caption: its image's standardised features -> its e5 vector."""
    features = train.features.double()
    mean, scale = features.mean(0), features.std(0).clamp(min=1e-6)
    x = ((features - mean) / scale)[torch.from_numpy(train.caption_image)]
    y = torch.from_numpy(np.stack([vectors[c] for c in train.caption_ids])).double()
    target_mean = y.mean(0)
    return RidgeMap(mean, scale, ridge(x, y - target_mean, strength), target_mean, strength)


def peer_measure(model: RidgeMap, held, vectors: dict[str, np.ndarray]) -> dict:
    sentences = torch.from_numpy(np.stack([vectors[c] for c in held.caption_ids]))
    return per_language_recalls(model.images(held.features), sentences, torch.from_numpy(held.caption_image),
                                torch.from_numpy(held.caption_lang), held.languages)  # fmt: skip


def peer_fitter(vectors: dict[str, np.ndarray], chosen: list):
    """fit: the ridge strength that scores best on a fifth of the training photos (drawn by
    the same hash as the folds), then the map refitted on all of them."""

    def fit(train, seed: int, after_epoch) -> None:
        inner = fold_of_images(train.image_ids, 5, seed=1000 + seed) == 0
        fitting, checking = train.only_images(~inner), train.only_images(inner)
        scores = {s: mean_mr(peer_measure(fit_ridge(fitting, vectors, s), checking, vectors)) for s in RIDGE_STRENGTHS}
        best = max(scores, key=scores.get)
        chosen.append(best)
        after_epoch(fit_ridge(train, vectors, best))

    return fit, lambda model, held: peer_measure(model, held, vectors)


# -- rows ----------------------------------------------------------------------------------
def fitter(name: str, row: dict, data: dict, splits: dict, args, device):
    base = {"data.dataset": data.get("dataset", "embedded"), **parse_assignments(args.assignments), **row.get("set", {})}
    lp = row.get("lp", "inputs")
    if lp == "none":
        base["pretrain.enabled"] = False

    def cfg_of(seed: int):
        return resolve(args.preset, {**base, "train.seed": seed})

    if row.get("peer") == "e5-ridge":
        every = [c for split in splits.values() for c in split.caption_ids]
        if not row.get("texts") or None in every:
            sys.exit(f"row {name!r}: the e5 peer needs 'texts' (the workdir) and inputs exported with caption ids")
        cache = Path(args.cache) / f"e5-{Path(row['inputs']).stem}.npy"
        vectors = e5_vectors(row["texts"], data.get("dataset", "embedded"), every, cache)
        chosen: list[float] = []
        return (*peer_fitter(vectors, chosen), chosen, cfg_of)
    if lp not in ("inputs", "photographed", "none", "file"):
        sys.exit(f"row {name!r}: lp must be inputs, photographed, file or none, got {lp!r}")
    if lp == "file" and not Path(row.get("lp_file", "")).is_file():
        sys.exit(f"row {name!r}: lp=file needs lp_file, a file of bench/lp_without_photos.py")
    return (*mule_fitter(cfg_of, data, lp, splits["val"], device, row.get("lp_file", "")), None, cfg_of)


def with_progress(fit, label: str, total: int):
    """fit, printing each model's end with its speed and the row's ETA."""
    started, done = time.perf_counter(), [0]

    def timed(train, seed, after_epoch):
        fit(train, seed, after_epoch)
        done[0] += 1
        elapsed = time.perf_counter() - started
        print(f"{label}: model {done[0]}/{total} (seed {seed}, {train.n_images} training photos) "
              f"{elapsed / done[0]:.0f} s each, ETA {format_seconds(elapsed / done[0] * (total - done[0]))}",
              flush=True)  # fmt: skip

    return timed


def table_markdown(runs: dict[str, list[FoldRun]], languages: list[str], rows: dict, at_epoch: int | None) -> str:
    """One line per row: mR per language and their mean (mean ± std over seeds) after the
    row's epochs (or at_epoch), the difference from its baseline row (its "vs", else the
    first row) after as many epochs as the row trained (a model fitted in one go: against
    the baseline's own length), chance last."""

    def epochs(name: str) -> int:
        return min(len(r.tables) for r in runs[name])

    first = next(iter(runs))
    lines = ["| row | epochs | " + " | ".join(languages) + " | mean | difference (paired by seed) |",
             "|" + "---|" * (len(languages) + 4)]  # fmt: skip
    for name, found in runs.items():
        at = min(at_epoch or epochs(name), epochs(name))
        summary = summarize(found, at)
        cells = [f"{summary[lang]['mR']:.1f} ± {summary[lang]['std']:.1f}" if lang in summary else "–"
                 for lang in languages]  # fmt: skip
        baseline, versus = rows[name].get("vs", first), ""
        if name != baseline and baseline in runs:
            once = bool(rows[name].get("peer"))  # fitted in one go: against the baseline as it is used
            base_at = min(at_epoch or epochs(baseline), epochs(baseline)) if once else min(at, epochs(baseline))
            difference = paired_difference(summary["mean"]["by_seed"], summarize(runs[baseline], base_at)["mean"]["by_seed"])
            versus = f"{difference} vs {baseline} after {base_at}"
        shown = "fitted once" if rows[name].get("peer") else str(at)
        lines.append(f"| {name} | {shown} | " + " | ".join(cells) + f" | {summary['mean']['mR']:.1f} ± "
                     f"{summary['mean']['std']:.1f} | {versus} |")  # fmt: skip
    top = summarize(runs[first])
    chance = [f"{top[lang]['chance']:.1f}" if lang in top else "–" for lang in languages]
    lines.append("| chance (random ranking of the same photos and sentences) | | " + " | ".join(chance)
                 + f" | {top['mean']['chance']:.1f} | |")  # fmt: skip
    return "\n".join(lines)


def epoch_curve(runs: list[FoldRun]) -> list[float]:
    """Mean mR over languages, folds and seeds after each epoch."""
    return [summarize(runs, epoch)["mean"]["mR"] for epoch in range(1, min(len(r.tables) for r in runs) + 1)]


def run_folds(rows: dict, args, device) -> dict:
    seeds = [int(s) for s in args.seeds.split(",")]
    out, summaries, languages, every_run = {}, {}, [], {}
    for name, row in rows.items():
        data, splits = train_on_workdir.load_inputs(row["inputs"])
        pool = splits["train"]
        fit, measure, chosen, _ = fitter(name, row, data, splits, args, device)
        print(f"== {name}: {pool.n_images} photographed training images, {len(pool.caption_image)} captions, "
              f"{args.folds} folds x seeds {seeds}", flush=True)  # fmt: skip
        started = time.perf_counter()
        runs = cross_validate(pool, args.folds, seeds, with_progress(fit, name, args.folds * len(seeds)), measure)
        curve, every_run[name] = epoch_curve(runs), runs
        summaries[name] = summarize(runs, min(args.at_epoch or len(curve), len(curve)))
        languages = languages or list(pool.languages)
        out[name] = {"summary": summaries[name], "epoch_curve": [round(v, 2) for v in curve],
                     "best_epochs": int(np.argmax(curve)) + 1, "seconds": round(time.perf_counter() - started),
                     "ridge_strengths": chosen, "row": row,
                     "runs": [dataclasses.asdict(r) for r in runs]}  # fmt: skip
        if args.out:  # what is done so far, row by row: a stop loses one row at most
            Path(args.out).write_text(json.dumps({"rows": out, "partial": True}, default=float))
        print(f"{name}: mean mR {summaries[name]['mean']['mR']:.1f} ± {summaries[name]['mean']['std']:.1f} "
              f"(chance {summaries[name]['mean']['chance']:.1f}); by epoch {' '.join(f'{v:.1f}' for v in curve)}",
              flush=True)  # fmt: skip
    markdown = table_markdown(every_run, languages, rows, args.at_epoch)
    at = f", after {args.at_epoch} epochs" if args.at_epoch else ""
    print(f"\nvalidation folds: mR per language, mean ± std over seeds {seeds} of the {args.folds}-fold mean{at}\n")
    print(markdown)
    return {"rows": out, "markdown": markdown, "folds": args.folds, "seeds": seeds, "at_epoch": args.at_epoch}


def combine(paths: list[str], args) -> dict:
    """One table from the rows of several --out files (the same folds and seeds)."""
    every_run, rows, languages = {}, {}, []
    for path in paths:
        for name, found in json.loads(Path(path).read_text())["rows"].items():
            every_run[name] = [FoldRun(**r) for r in found["runs"]]
            rows[name] = found["row"]
            languages = languages or list(every_run[name][0].tables[0])
    markdown = table_markdown(every_run, languages, rows, args.at_epoch)
    at = f", after {args.at_epoch} epochs" if args.at_epoch else ""
    print(f"validation folds{at}: mR per language, mean ± std over seeds\n\n{markdown}")
    return {"markdown": markdown, "at_epoch": args.at_epoch, "combined": paths}


def run_test(rows: dict, args, device) -> dict:
    """Each row trained on every photographed training image, the test split read once."""
    seeds = [int(s) for s in args.seeds.split(",")]
    chosen_epochs = json.loads(Path(args.epochs_from).read_text())["rows"] if args.epochs_from else {}
    out, every_run, languages = {}, {}, []
    for name, row in rows.items():
        data, splits = train_on_workdir.load_inputs(row["inputs"])
        pool, test = splits["train"], splits["test"]
        if name in chosen_epochs and not row.get("peer"):
            row = row | {"set": {**row.get("set", {}), "train.epochs": chosen_epochs[name]["best_epochs"]}}
        fit, measure, chosen, _ = fitter(name, row, data, splits, args, device)
        runs, timed = [], with_progress(fit, name, len(seeds))
        for seed in seeds:
            tables: list = []
            timed(pool, seed, lambda model, tables=tables, measure=measure, test=test: tables.append(measure(model, test)))
            chance = chance_table(torch.from_numpy(test.caption_image), torch.from_numpy(test.caption_lang),
                                  test.languages)  # fmt: skip
            runs.append(FoldRun(0, seed, tables, chance, test.n_images))
        every_run[name] = runs
        languages = languages or list(test.languages)
        out[name] = {"summary": summarize(runs), "runs": [dataclasses.asdict(r) for r in runs],
                     "epochs": row.get("set", {}).get("train.epochs"),
                     "ridge_strengths": chosen, "test_images": test.n_images}  # fmt: skip
    markdown = table_markdown(every_run, languages, rows, None)
    print(f"\ntest split, read once: mR per language, mean ± std over seeds {seeds}\n")
    print(markdown)
    return {"rows": out, "markdown": markdown, "seeds": seeds}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows")
    parser.add_argument("--combine", nargs="+", help="print one table of these --out files instead of training")
    parser.add_argument("--folds", type=int, default=5)
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--preset", help="default: the dataset's (config.resolution.default_preset)")
    parser.add_argument("--set", dest="assignments", action="append", default=[], help="an override for every row")
    parser.add_argument("--only", action="append", help="run only these rows (repeatable; the first row always)")
    parser.add_argument("--test", action="store_true", help="train on every photographed image, read the test split")
    parser.add_argument("--epochs-from", help="with --test: each row's best epoch count on the folds (a --out file)")
    parser.add_argument("--at-epoch", type=int, help="compare the rows after this many epochs (the first E of a "
                        "longer run are an E-epoch run: the learning rate decays by step, not by the run's length)")
    parser.add_argument("--cache", default=".", help="where the peer's e5 vectors are cached")
    parser.add_argument("--out")
    args = parser.parse_args()
    import logging

    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(message)s", datefmt="%H:%M:%S")
    if args.combine:
        result = combine(args.combine, args)
        if args.out:
            Path(args.out).write_text(json.dumps(result, indent=1))
        return
    all_rows = json.loads(Path(args.rows).read_text())
    first = next(iter(all_rows))
    rows = {k: v for k, v in all_rows.items() if not args.only or k in args.only or k == first}
    device = resolve_device(resolve(args.preset, {}).train.device)
    print(f"machine: {platform.node()}, {platform.processor() or platform.machine()}, {device}, "
          f"{torch.get_num_threads()} threads, torch {torch.__version__}", flush=True)  # fmt: skip
    result = run_test(rows, args, device) if args.test else run_folds(rows, args, device)
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1, default=float))
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
