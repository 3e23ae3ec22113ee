"""Milliseconds per training step of LP and joint training, on exported inputs, for this
checkout and (run right after it, same machine, same hour) for a commit you name.

    python bench/train_on_workdir.py --workdir W --export inputs.pt      # once: the demo's or the real text's
    python bench/step_times.py --inputs inputs.pt [--baseline COMMIT] [--threads 1] [--steps 5]

Times LP's warm-up steps (every negative counts: loss.mining_warmup_steps), LP's mined steps
(the top k), and joint training's mined steps (skipped for text-only inputs), each after one
step that is not timed, with the defaults (or --set). The same batches for both checkouts:
one seed, one sampler. What a whole run takes is in bench/stage_times.py; this isolates the
step, where LP's and training's time goes.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from stage_times import remove_worktree, worktree  # a commit's checkout beside this one (bench/ is on the path)

REPO = Path(__file__).resolve().parents[1]
# Runs this script with a checkout's mule: mule.<folder> maps onto the checkout's folders
RUNNER = """
import sys, types, runpy
root = sys.argv[1]
package = types.ModuleType("mule"); package.__path__ = [root]; sys.modules["mule"] = package
sys.path.insert(0, root + "/bench")
sys.argv = [sys.argv[2], *sys.argv[3:]]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def measure(inputs: str, threads: int, steps: int, sets: list[str]) -> dict[str, float]:
    import torch
    import train_on_workdir as tw

    from mule.config.presets import PRESETS
    from mule.config.resolution import resolve
    from mule.mule_core.training.joint import JointTrainer
    from mule.mule_core.training.lp import LPTrainer

    torch.set_num_threads(threads)
    data, splits = tw.load_inputs(inputs)
    defaults = "default" if "default" in PRESETS else "demo"  # the defaults' steps (before 2026-11-26: "demo")
    cfg = resolve(defaults, {"data.dataset": data.get("dataset", "embedded"), **dict(s.split("=", 1) for s in sets)})
    features = splits["train"].features
    out = {}
    for label, mode, mined in (("LP warm-up", "lp", False), ("LP mined", "lp", True), ("joint mined", "joint", True)):
        if mode == "joint" and features is None:
            continue
        torch.manual_seed(0)
        model = tw.build(cfg, data, features.shape[1] if mode == "joint" else None)
        if mode == "joint":
            model.set_image_normalization(features)
        if mode == "lp":
            trainer = LPTrainer(model, splits["train"], cfg.loss, cfg.train, torch.device("cpu"), pretrain=cfg.pretrain)
        else:
            trainer = JointTrainer(model, splits["train"], cfg.loss, cfg.train, torch.device("cpu"))
        if mined:  # past the warm-up: the top k
            trainer.scheduler.last_epoch = trainer.mining_warmup_steps
        batches = trainer.sampler.batches(1)
        trainer._train_mode()
        times = []
        for _ in range(steps + 1):
            batch = next(batches)
            started = time.perf_counter()
            parts = trainer.losses(batch)
            total = sum(v for k, v in parts.items() if k != "lc_accuracy")
            trainer.optimizer.zero_grad(set_to_none=True)
            total.backward()
            trainer.optimizer.step()
            times.append(time.perf_counter() - started)
        out[f"{label} ms/step"] = round(1000 * sum(times[1:]) / steps, 1)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--inputs", required=True)
    parser.add_argument("--baseline", help="a commit to time right after this checkout")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--set", action="append", default=[], dest="sets")
    parser.add_argument("--json", action="store_true", help=argparse.SUPPRESS)  # one checkout's figures, as JSON
    args = parser.parse_args()
    if args.json:
        print(json.dumps(measure(args.inputs, args.threads, args.steps, args.sets)))
        return
    common = ["--inputs", args.inputs, "--threads", str(args.threads), "--steps", str(args.steps), "--json",
              *[a for s in args.sets for a in ("--set", s)]]  # fmt: skip
    checkouts = {"this checkout": REPO}
    with tempfile.TemporaryDirectory() as root:
        if args.baseline:
            checkouts[f"baseline {args.baseline}"] = worktree(args.baseline, Path(root))
        results = {}
        try:
            for name, checkout in checkouts.items():
                script = str(checkout / "bench" / "step_times.py")
                if not Path(script).exists():  # a commit from before this script: its code, this script
                    script = str(Path(__file__).resolve())
                done = subprocess.run([sys.executable, "-c", RUNNER, str(checkout), script, *common],
                                      capture_output=True, text=True, check=True)  # fmt: skip
                results[name] = json.loads(done.stdout.strip().splitlines()[-1])
        finally:
            if args.baseline:
                remove_worktree(checkouts[f"baseline {args.baseline}"])
    names = list(results)
    print(f"inputs {args.inputs}; {args.threads} thread(s); mean of {args.steps} steps after one untimed\n")
    print("| | " + " | ".join(names) + " |")
    print("|---|" + "---|" * len(names))
    for key in results[names[0]]:
        print(f"| {key} | " + " | ".join(str(results[n].get(key, "-")) for n in names) + " |")


if __name__ == "__main__":
    main()
