"""What storing a model's word and n-gram tables in float16 or int8 (`output.tables`) costs:
the model file's bytes and its val and test tables, each seed trained once and its file
written each way, through the commands a user types.

    python bench/table_precision.py [--workdir DIR] [--seeds 0,1,2] [--preset demo]
                                    [--precisions float32,float16,int8] [-- RUN_ARGS...]

The 7,478 real photos, one seed, in the workdir `mule run all` built (seed-0 a link to it):

    python bench/table_precision.py --workdir W --seeds 0 --preset "" -- --dataset multi30k \
        --source ../shared/datasets/multi30k --images ../shared/datasets/flickr8k-224/images

For each seed, in DIR/seed-N and for each precision: `mule run all --preset P --set
train.seed=N --set output.tables=PRECISION`: the train stage runs again (its key holds the
option) to the same weights and stores them rounded, and evaluate measures the file on the
test split. The val figure is the same file measured on the val split (the split the
epoch was kept on). RUN_ARGS go to every run (`--dataset multi30k --source ... --images ...`
for the real photos). A workdir kept from an earlier sitting is reused: what ran is not run
again. Prints, per seed and their mean: the model file's MiB and the val and test mean mR
each way, and the paired differences from float32.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

from stage_times import cpu_model  # bench/ is on the path


def run(workdir: Path, preset: str, seed: int, precision: str, extra: list[str]) -> dict:
    cmd = [sys.executable, "-m", "mule.commands.main", "run", "all", "--workdir", str(workdir),
           *(["--preset", preset] if preset else []), "--set", f"train.seed={seed}", "--set",
           f"output.tables={precision}", *extra]  # fmt: skip
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    evaluation = json.loads(next((workdir / "results").glob("*/evaluation.json")).read_text())
    model = Path(evaluation["model"])
    return {"mib": model.stat().st_size / 2**20, "test": evaluation["mean_mR"], "val": val_mr(workdir, model)}


def val_mr(workdir: Path, model_file: Path) -> float:
    """The model file's mean mR on the val split, read from the workdir's catalog."""
    import torch

    from mule.data_catalog.model_files import load_model
    from mule.data_catalog.splits import load_split
    from mule.data_catalog.tables import Catalog
    from mule.mule_core.encoding import evaluate_split
    from mule.mule_core.metrics import mean_mr
    from mule.storage.workdir import Workdir

    model, meta = load_model(model_file)
    cfg = meta["cfg"]
    dataset = meta["dataset"]
    catalog = Catalog(Workdir.at(workdir), read_only=True)
    val = load_split(catalog, dataset, "val", meta["vocabulary"], cfg.text.max_tokens, meta["extractor"])
    return mean_mr(evaluate_split(model, val, torch.device("cpu"), (1, 5, 10)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", default="table-precision", help="one workdir per seed below it (kept, resumable)")
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--preset", default="demo", help='"": the one the dataset\'s photos choose')
    parser.add_argument("--precisions", default="float32,float16,int8", help="float32 first: the others' reference")
    parser.add_argument("extra", nargs="*", help="after --: more arguments for mule run all")
    args = parser.parse_args()
    precisions = args.precisions.split(",")
    rows = []
    for seed in (int(s) for s in args.seeds.split(",")):
        workdir = Path(args.workdir) / f"seed-{seed}"
        row = {p: run(workdir, args.preset, seed, p, args.extra) for p in precisions}
        rows.append((seed, row))
        print(f"seed {seed}: " + "; ".join(f"{p} {r['mib']:.2f} MiB, val {r['val']:.3f}, test {r['test']:.3f}"
                                          for p, r in row.items()), flush=True)  # fmt: skip
    print(f"\n{cpu_model()}, {len(rows)} seed(s), preset {args.preset}\n")
    print("| seed | " + " | ".join(f"{p}: MiB, val mR, test mR" for p in precisions) + " |")
    print("|---|" + "---|" * len(precisions))
    for seed, row in rows:
        print(f"| {seed} | " + " | ".join(f"{r['mib']:.2f}, {r['val']:.2f}, {r['test']:.2f}" for r in row.values()) + " |")
    reference = precisions[0]
    for split in ("val", "test"):
        spread = statistics.stdev(row[reference][split] for _, row in rows) if len(rows) > 1 else float("nan")
        for p in precisions[1:]:
            differences = [row[p][split] - row[reference][split] for _, row in rows]
            size = statistics.mean(row[p]["mib"] / row[reference]["mib"] for _, row in rows)
            print(f"{p} - {reference}, {split}: mean {statistics.mean(differences):+.3f} mR (largest "
                  f"{max(differences, key=abs):+.3f}; {reference}'s seeds' spread {spread:.2f}); bytes {size:.3f} "
                  f"of {reference}'s")  # fmt: skip


if __name__ == "__main__":
    main()
