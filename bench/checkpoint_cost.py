"""What a checkpoint written beside training costs the training: LP steps on a workdir's
text, timed after an epoch end that wrote no checkpoint, one written at the same CPU
priority as training, and one written as the stage writes it (tasks/shared/checkpoints.py:
a thread at nice 19).

    python bench/checkpoint_cost.py --workdir W [--dataset multi30k] [--steps 45] [--rounds 2]

Each round: an "epoch" of --steps LP steps after each kind of epoch end, in the order none,
same priority, nice 19. Prints, per kind, the seconds of the first 15 steps (those the write
overlaps), of the next 15, of all the steps, and the write's own seconds. The checkpoint is
the stage's: the trainer's state_dict copied at the epoch's end (snapshot) and written
atomically with torch.save, to a scratch file beside the workdir's checkpoints.
Run it alone on the machine (two CPU-heavy runs at once stall each other).
"""

from __future__ import annotations

import argparse
import os
import platform
import threading
import time
from pathlib import Path

import torch
from checkout import use_checkout  # noqa: E402

use_checkout()  # run from anywhere, installed or not

from mule.config.resolution import resolve  # noqa: E402
from mule.data_catalog.model_files import save_atomic  # noqa: E402
from mule.data_catalog.splits import load_split, load_vocabulary  # noqa: E402
from mule.data_catalog.tables import Catalog  # noqa: E402
from mule.mule_core.model import build_model  # noqa: E402
from mule.mule_core.training.lp import LPTrainer  # noqa: E402
from mule.storage.workdir import Workdir  # noqa: E402
from mule.tasks.shared.checkpoints import snapshot, yield_cpu  # noqa: E402

KINDS = ("none", "same priority", "nice 19")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workdir", required=True, help="a workdir whose text stage has run")
    parser.add_argument("--dataset", default="multi30k")
    parser.add_argument("--preset", default=None)
    parser.add_argument("--steps", type=int, default=45)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()

    cfg = resolve(args.preset, {"data.dataset": args.dataset})
    workdir = Workdir.at(args.workdir)
    catalog = Catalog(workdir)
    vocabulary = load_vocabulary(catalog, args.dataset, cfg.data.languages, cfg.model)
    train = load_split(catalog, args.dataset, "train", vocabulary, cfg.text.max_tokens, captions=cfg.data.captions)
    torch.manual_seed(0)
    model = build_model(cfg.model, vocabulary, image_dim=None)
    trainer = LPTrainer(model, train, cfg.loss, cfg.train, torch.device("cpu"), validate=None,
                      pretrain=cfg.pretrain)  # fmt: skip
    stamps: list[float] = []
    epoch_batches = trainer.sampler.batches

    def some_batches(epoch):
        for i, batch in enumerate(epoch_batches(epoch)):
            if i >= args.steps:
                break
            stamps.append(time.perf_counter())
            yield batch
        stamps.append(time.perf_counter())

    trainer.sampler.batches = some_batches
    trainer.scheduler.last_epoch = 10_000  # past the mining warm-up: the steps of most of LP
    trainer.run_epoch()  # warm
    scratch = Path(workdir.root) / "checkpoints-bench.pt"
    print(f"machine: {platform.node()}, {os.cpu_count()} CPUs; torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads; {args.dataset} LP, {args.steps} steps an epoch", flush=True)  # fmt: skip
    try:
        for round_ in range(1, args.rounds + 1):
            for kind in KINDS:
                writer, wrote = None, {}
                if kind != "none":
                    state = {"key": "bench", "trainer": snapshot(trainer.state_dict())}

                    def write(state=state, kind=kind, wrote=wrote):
                        if kind == "nice 19" and not yield_cpu():
                            wrote["note"] = "(could not lower the priority here)"
                        started = time.perf_counter()
                        save_atomic(state, scratch)
                        wrote["seconds"] = time.perf_counter() - started

                    writer = threading.Thread(target=write)
                    writer.start()
                stamps.clear()
                trainer.run_epoch()
                steps = [b - a for a, b in zip(stamps, stamps[1:])]
                if writer is not None:
                    writer.join()
                written = f"; the write {wrote['seconds']:.1f} s {wrote.get('note', '')}" if writer else ""
                print(f"round {round_}, {kind:>13}: first 15 steps {sum(steps[:15]):5.2f} s, next 15 "
                      f"{sum(steps[15:30]):5.2f} s, all {len(steps)} {sum(steps):5.2f} s{written}", flush=True)  # fmt: skip
    finally:
        scratch.unlink(missing_ok=True)


if __name__ == "__main__":
    main()
