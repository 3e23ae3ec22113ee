"""What the next `mule demo` does with a damaged workdir: every kind of file a workdir
holds, cut to half its size, deleted, or overwritten with as many random bytes.

    python bench/damaged_workdir.py [--workdir /tmp/mule-damage] [--only model]

Builds a tiny workdir once (`mule demo` at the tests' tiny sizes), then for each case
copies it, damages one file, runs the same command again and prints a table: the exit
code, the seconds, the stages that ran (with the reason of the first) or the error line.
A case is fine when the rerun exits 0 having rerun what the file belonged to, or exits 2
with one line naming the file and what to do (what mule cannot repair: the MLflow store,
raw dataset files the user gave).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.test_damage import DAMAGES, damage  # noqa: E402 - the tests' damages, the same here

SIZES = ["--train-images", "48", "--val-images", "16", "--test-images", "24"]
SETS = {"data.image_size": 48, "features.input_size": 32, "vectors.fasttext_epochs": 3, "pretrain.epochs": 2,
        "pretrain.batch_images": 16, "train.epochs": 10, "train.batch_images": 16, "loss.mining_warmup_steps": 3,
        "pretrain.mining_warmup_steps": 3, "eval.examples": 1, "features.shard_images": 32}  # fmt: skip

# kind -> a glob under the workdir (the first match is damaged)
KINDS = {
    "catalog table: captions": "catalog/captions/embedded.parquet",
    "catalog table: images": "catalog/images/embedded.parquet",
    "catalog table: rejects": "catalog/rejects/embedded.parquet",
    "catalog table: image rejects": "catalog/rejects/embedded.images.parquet",
    "catalog table: MT captions": "catalog/captions/embedded.mt.parquet",
    "catalog table: translations": "catalog/translations/embedded.parquet",
    "catalog table: word vectors": "catalog/word_vectors/embedded.parquet",
    "feature part": "catalog/features/embedded/*/part-*-00001.parquet",
    "features pointer (current.json)": "catalog/features/embedded/current.json",
    "extractor description": "catalog/features/embedded/*/extractor.json",
    "catalog database (views)": "catalog.duckdb",
    "LP model": "models/embedded/pretrain.pt",
    "model": "models/embedded/model.pt",
    "stage record": "state/stages/embedded/train.json",
    "file digest cache": "state/file_hashes.json",
    "ceiling cache": "state/embedded/ceiling-test.json",
    "generated dataset manifest": "raw/embedded/manifest.json",
    "generated scenes": "raw/embedded/scenes.jsonl",
    "generated captions file": "raw/embedded/data/task2/raw/train.1.en.gz",
    "generated image": "raw/embedded/images/train-000001.jpg",
    "generated lexicon": "raw/embedded/dictionaries/en-de.txt",
    "published result": "results/embedded/evaluation.json",
    "published figure": "results/embedded/recalls.png",
    "MLflow store": "mlflow.db",
    "MLflow artifact": "mlartifacts/*/*/artifacts/config.json",
    "Prefect database": "prefect/prefect.db",
    "workdir description": "workdir.json",
    "lock file": "mule.lock",
}


def mule(workdir: Path) -> list[str]:
    sets = [a for k, v in SETS.items() for a in ("--set", f"{k}={v}")]
    return [str(Path(sys.executable).with_name("mule")), "demo", "--workdir", str(workdir), *SIZES, *sets]


def ran(output: str) -> str:
    """The stages the run ran, from its closing table ("  train      ran (reason)")."""
    lines = re.findall(r"^  (\S+)\s+ran \((.*)\)$", output, re.M)
    if not lines:
        return "nothing ran" if "up to date" in output else "?"
    first = lines[0][1]
    return ", ".join(s for s, _ in lines) + f" [{lines[0][0]}: {first[:70]}]"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", default="/tmp/mule-damage")
    parser.add_argument("--only", help="kinds containing this text")
    args = parser.parse_args()
    built = Path(args.workdir) / "built"
    if not (built / "state/stages/embedded/evaluate.json").exists():
        shutil.rmtree(built, ignore_errors=True)
        print("building the tiny workdir ...", flush=True)
        subprocess.run(mule(built), check=True, stdout=subprocess.DEVNULL)
    print("| file | damage | exit | s | what the rerun did |\n|---|---|---|---|---|", flush=True)
    for kind, pattern in KINDS.items():
        if args.only and args.only not in kind:
            continue
        for how in DAMAGES:
            case = Path(args.workdir) / "case"
            shutil.rmtree(case, ignore_errors=True)
            shutil.copytree(built, case, symlinks=True)
            matches = sorted(case.glob(pattern))
            if not matches:
                print(f"| {kind} | {how} | | | no file {pattern} |", flush=True)
                break
            damage(matches[0], how)
            started = time.perf_counter()
            done = subprocess.run(mule(case), capture_output=True, text=True, timeout=600)
            seconds = time.perf_counter() - started
            output = done.stdout + done.stderr
            if done.returncode == 0:
                said = ran(done.stdout)
            else:
                error_lines = [line for line in done.stderr.splitlines() if line.strip()]
                traceback = "Traceback" in done.stderr
                said = ("TRACEBACK: " if traceback else "") + (error_lines[-1][:160] if error_lines else "?")
            print(f"| {kind} (`{matches[0].relative_to(case)}`) | {how} | {done.returncode} | {seconds:.0f} | "
                  f"{said.replace('|', '/')} |", flush=True)  # fmt: skip
            if os.environ.get("DAMAGE_VERBOSE"):
                print(output[-3000:])
    return 0


if __name__ == "__main__":
    sys.exit(main())
