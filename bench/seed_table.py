"""Settings tables that hold up: every row trained with several seeds, reported as mean ±
spread, and every row's difference from the first row paired by seed.

    python bench/seed_table.py --rows rows.json [--seeds 0,1,2] [--lp-only] [--only ROW] [--out table.json]
    python bench/seed_table.py --rows rows.json --combine a.json b.json ...   # the table of runs made apart

rows.json: {"row name": {"inputs": "file.pt", "vectors": "other.pt", "set": {"section.option": value}}, ...};
the first row is the baseline. `inputs` are files written by
`bench/train_on_workdir.py --export` (a workdir's splits, word vectors and, unless
--text-only, image features): rows can differ by their inputs (fastText or e5 vectors, MT
captions) or by settings; `vectors` (optional) takes only the word vectors of another such
file (the same captions, another vectors.init: the image features need not travel twice).
A seed is `train.seed`: the model's initial weights and the
order of the batches (the data and the word vectors stay the same).

Settings are chosen on validation; the test split is read after, once, and shown beside it.
Joint training rows (LP first, then the train stage's training): validation and test mR.
--lp-only rows (text without images: LP alone): R@1 per en->x pair at the MULE layer,
image level and translation pairs, and the perfect-translation ceiling (English queries
against task1's English lines, the ones the other languages translate: what en->x image
level would be with translations that lose nothing; bench/lp_ceiling.py until 2026-12-06), on the
validation split first, then on the test split. `--last-weights` adds, for each LP row
with pretrain.ema on, the row of its raw weights ("<row> (last weights)": what
pretrain.ema=0 keeps, from the same runs: the average never feeds back into training).

Spread and verdict as experiments/seeds.py defines them (the ablation's report uses the
same): a row's difference from the baseline is taken seed by seed, then averaged; it is
called a gain (or a loss) only when every seed moves the same way and the mean exceeds
the differences' spread, else "none": a difference inside the noise is not a result.
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path

import torch
from checkout import use_checkout

use_checkout()  # run from anywhere, installed or not

import train_on_workdir  # noqa: E402

from mule.config.overrides import parse_assignments  # noqa: E402
from mule.config.resolution import resolve  # noqa: E402
from mule.experiments.seeds import mean_spread, paired_difference  # noqa: E402
from mule.mule_core.devices import resolve_device  # noqa: E402


def metrics_of(result: dict, lp_only: bool) -> dict[str, float]:
    if not lp_only:
        return {"val mR": result["val"], "test mR": result["test"]}
    out = {}
    for split in ("val", "test"):
        out |= {f"{split} {pair} R@1": r1 for pair, r1 in result[f"{split}_r1"].items() if pair.startswith("en->")}
        out |= {f"{split} {pair} R@1 (translation)": r1 for pair, r1 in result.get(f"{split}_translation_r1", {}).items()
                if pair.startswith("en->")}  # fmt: skip
        if f"{split}_ceiling_r1" in result:
            out[f"{split} ceiling R@1"] = result[f"{split}_ceiling_r1"]
    return out


def print_table(rows: dict, results: dict, seeds: list[int]) -> None:
    baseline = next(iter(rows))
    if baseline not in results:
        raise SystemExit(f"the baseline row {baseline!r} has no results")
    columns = list(next(iter(results[baseline].values())))
    print(f"\nmean ± spread over seeds {seeds}; difference from '{baseline}' paired by seed\n")
    print("| row | " + " | ".join(columns) + " |\n|---|" + "---|" * len(columns))
    names = [n for r in rows for n in (r, f"{r} (last weights)")]
    for name in [r for r in names if r in results and all(s in results[r] for s in seeds)]:
        by_seed, cells = results[name], []
        for column in columns:
            values = [by_seed[s][column] for s in seeds]
            cell = mean_spread(values)
            if name != baseline:
                base = {s: results[baseline][s][column] for s in seeds}
                cell += f"; {paired_difference({s: v for s, v in zip(seeds, values)}, base)}"
            cells.append(cell)
        print(f"| {name} | " + " | ".join(cells) + " |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", required=True)
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--preset", help="default: the dataset's (config.resolution.default_preset)")
    parser.add_argument("--lp-only", action="store_true")
    parser.add_argument(
        "--last-weights",
        action="store_true",
        help="LP rows with pretrain.ema on: also the raw weights' row, from the same runs",
    )
    parser.add_argument("--only", action="append", help="run only these rows (repeatable)")
    parser.add_argument(
        "--set",
        dest="assignments",
        action="append",
        default=[],
        help="an override for every row (a row's own settings win)",
    )
    parser.add_argument("--out")
    parser.add_argument("--combine", nargs="+", help="print the table of these --out files instead of training")
    args = parser.parse_args()
    all_rows = json.loads(Path(args.rows).read_text())
    seeds = [int(s) for s in args.seeds.split(",")]
    if args.combine:
        results = {}
        for path in args.combine:
            part = json.loads(Path(path).read_text())
            for name, by_seed in part["results"].items():  # one row's seeds may come from several files
                results.setdefault(name, {}).update({int(s): v for s, v in by_seed.items()})
        print_table(all_rows, results, seeds)
        return
    rows = {k: v for k, v in all_rows.items() if not args.only or k in args.only}
    device = resolve_device(resolve(args.preset, {}).train.device)
    print(f"machine: {platform.node()}, {device} {torch.cuda.get_device_name() if device.type == 'cuda' else ''}, "
          f"{torch.get_num_threads()} threads, torch {torch.__version__}; seeds {seeds}", flush=True)  # fmt: skip
    results: dict[str, dict[int, dict[str, float]]] = {}
    loaded: dict[str, tuple] = {}
    for name, row in rows.items():
        if row["inputs"] not in loaded:
            loaded = {row["inputs"]: train_on_workdir.load_inputs(row["inputs"])}  # one file in memory at a time
        data, splits = loaded[row["inputs"]]
        if row.get("vectors"):
            data = data | {"vectors": torch.load(row["vectors"], map_location="cpu", weights_only=False)["vectors"]}
        for seed in seeds:
            overrides = {"data.dataset": data.get("dataset", "embedded"), **parse_assignments(args.assignments),
                         **row.get("set", {}), "train.seed": seed}  # fmt: skip
            cfg = resolve(args.preset, overrides)
            started = time.perf_counter()
            if not cfg.model.subwords:  # inputs exported with n-grams, read as a model without them would
                splits = train_on_workdir.words_outside_as_unknown(loaded[row["inputs"]][1], data)
            tag = f"{name} seed {seed}"
            if args.lp_only:
                found = train_on_workdir.lp_variant(tag, cfg, data, splits, device, args.last_weights)
            else:
                found = [train_on_workdir.train_variant(tag, cfg, data, splits, device, True, True)]
            for result, row_name in zip(found, (name, f"{name} (last weights)")):
                results.setdefault(row_name, {})[seed] = metrics_of(result, args.lp_only)
                print(f"{tag}: {row_name}: {results[row_name][seed]} ({time.perf_counter() - started:.0f} s)",
                      flush=True)  # fmt: skip
            if args.out:  # after every run: a run stopped at its time limit keeps what it finished
                Path(args.out).write_text(json.dumps({"seeds": seeds, "rows": rows, "results": results}, indent=1))
    if next(iter(all_rows)) in results:
        print_table(all_rows, results, seeds)


if __name__ == "__main__":
    main()
