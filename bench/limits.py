"""What mule adds to the work it runs: four ratios against the bare libraries doing the
same work on the same cores, measured side by side in one sitting. A ratio holds on any
host where an absolute time does not (this VM moves between hosts and drifts within the hour).

    python bench/limits.py [--workdir W [--built]] [--dataset D --source S [--images I]] [--preset P]
                           [--set KEY=VALUE ...] [--repeats 3] [--feature-images 600] [--steps 0]
                           [--ratios 1234] [--train-stages pretrain,train]

Without --dataset it runs `mule demo` (the embedded dataset); with it, `mule run all
--dataset D --source S [--images I]`. The workdir (default: a new temporary one) must be
empty: the first ratio is a rebuild from nothing (--built: a workdir this command built
before; the first ratio is then left out).

1. rebuild: the command's wall time over the sum of its stages' computations (each stage
   record's seconds): what starting Python, orchestration (Prefect), tracking (MLflow),
   publishing (figures, the registry) and waiting add. Target <= 1.25 (demo), 1.10 (real).
2. features: the features stage's shard path (tasks.features.extract_shard: decoding, the
   extractor through mule's engine, the Parquet part written) over the same work done bare,
   on the same images with the same threads: Pillow + torchvision decoding and cropping,
   then a bare ONNX Runtime InferenceSession (its default threads) of the same exported
   network, one after the other. Beside it: ORT alone and PyTorch alone on the decoded
   crops, and decoding alone. Alternated: bare, stage, bare. Target >= 0.9.
3. training: the pretrain and train stages' seconds per epoch (validation, checkpoints,
   progress, the weight average included), each forced to run again as a user would
   (`--force STAGE`: in its flow, tracked, its hooks), over a bare loop of the same model,
   losses and optimizer over the same tensors and batches: forward, backward, the tables'
   gradients, clipping, the step, nothing else. The bare loop is timed for one epoch
   before hardest-negative mining starts and one after (or --steps steps of each),
   weighted as the stage's epochs were; alternated: bare, stage, bare. Target >= 0.9.
   Beside it, the bare loop with the weight average (train.ema) done bare too, one more
   epoch after mining: how much of the gap is the average, which a bare loop leaves out.
4. no change: the same command again on the built workdir over `python -c "import
   mule.commands.main"` and over `python -c pass`; alternated, the median of --repeats
   each. Also: how long after the command returned the workdir's MLflow database was last
   written (a process left behind). Target <= 2x the import.
5. the machine: a joint training step's arithmetic (its matrix products' floating-point
   operations, forward and backward, counted by torch.utils.flop_counter from the shapes
   they ran at) per second, over a bare float32 matmul's on the same threads; and the bytes
   the step's optimizer and weight average move (Adam reads each stepped parameter, its
   gradient and two moments and writes three; the average reads two and writes one) over a
   bare elementwise pass's bandwidth: how far the step is from what the cores and the
   memory can do, not only from today's loop.

Every figure names the CPU it ran on.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))

STAGES = ("ingest", "translate", "features", "text", "pretrain", "train", "evaluate", "index")


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def cpu_line() -> str:
    fields = {}
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            fields.setdefault(key.strip(), value.strip())
    except OSError:
        pass
    family = f", family {fields['cpu family']} model {fields['model']}" if "cpu family" in fields else ""
    return f"{cpu_name()}{family}, {os.cpu_count()} cores"


def command(args: argparse.Namespace, workdir: Path) -> list[str]:
    """The command a user runs for this workdir and dataset."""
    settings = [a for s in args.set for a in ("--set", s)]
    preset = ["--preset", args.preset] if args.preset else []
    if not args.dataset:
        return [sys.executable, "-m", "mule.commands", "demo", "--workdir", str(workdir), *preset, *settings]
    images = ["--images", args.images] if args.images else []
    return [sys.executable, "-m", "mule.commands", "run", "all", "--dataset", args.dataset, "--source", args.source,
            *images, "--workdir", str(workdir), *preset, *settings]  # fmt: skip


def timed(cmd: list[str], log: Path | None = None) -> float:
    started = time.perf_counter()
    with open(log or os.devnull, "a") as out:
        done = subprocess.run(cmd, cwd=REPO, stdout=out, stderr=subprocess.STDOUT)
    seconds = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({done.returncode}); its output: {log}")
    return seconds


def records(workdir: Path, dataset: str) -> dict[str, dict]:
    folder = workdir / "state" / "stages" / dataset
    return {s: json.loads((folder / f"{s}.json").read_text()) for s in STAGES if (folder / f"{s}.json").exists()}


# -- 1. the rebuild ---------------------------------------------------------------------


def outside_the_stages(found: dict[str, dict], started: float, ended: float) -> dict[str, float]:
    """Where the wall time outside the stages' computations went: before the first stage
    began (Python, the config, the MLflow and Prefect set-up), between stages (deciding,
    publishing, Prefect's task runs) and after the last (the results, the exit); from each
    record's finish time and seconds (time.time())."""
    spans = sorted((r["finished"] - float(r.get("seconds") or 0.0), r["finished"]) for r in found.values() if r.get("finished"))
    if not spans:
        return {}
    between = sum(max(0.0, b[0] - a[1]) for a, b in zip(spans, spans[1:]))
    return {"before": spans[0][0] - started, "between": between, "after": ended - spans[-1][1]}


def rebuild_ratio(args, workdir: Path, dataset: str) -> dict:
    started = time.time()
    wall = timed(command(args, workdir), workdir.parent / f"{workdir.name}-rebuild.log")
    found = records(workdir, dataset)
    computed = {s: float(r.get("seconds") or 0.0) for s, r in found.items() if r.get("status", "ran") != "reused"}
    total = sum(computed.values())
    outside = outside_the_stages(found, started, time.time())
    print(f"\n1. rebuild from an empty workdir: {wall:.1f} s wall; the stages computed {total:.1f} s "
          f"({', '.join(f'{s} {v:.1f}' for s, v in computed.items())})")  # fmt: skip
    print(f"   wall / computations = {wall / total:.2f}   (target <= {1.25 if not args.dataset else 1.10}; "
          f"{wall - total:.1f} s outside the stages: {', '.join(f'{k} {v:.1f}' for k, v in outside.items())})",
          flush=True)  # fmt: skip
    return {"wall_s": wall, "computed_s": computed, "ratio": wall / total, "outside_s": outside}


# -- 2. features --------------------------------------------------------------------------


def features_ratio(cfg, workdir: Path, dataset: str, n: int, scratch: Path) -> dict:
    import numpy as np
    import onnxruntime as ort
    import torch
    from features_throughput import catalog_with
    from PIL import Image

    from mule.data_catalog import queries
    from mule.data_catalog.tables import Catalog
    from mule.data_catalog.weights import extractor_module
    from mule.mule_core.backbones import crop_transform, engine_for, extract, numerics, prepare_for_inference
    from mule.mule_core.devices import resolve_device
    from mule.mule_core.onnx_engine import export
    from mule.storage.workdir import Workdir
    from mule.tasks.features import batch_size_for, extract_shard

    f = cfg.features
    device = resolve_device(f.device)
    paths = sorted(Path(p) for p in queries.image_paths(Catalog(Workdir.at(workdir), read_only=True), dataset).values()
                   if p and Path(p).is_file())[:n]  # fmt: skip
    n = len(paths)
    threads = torch.get_num_threads()
    batch = batch_size_for(f, device, threads)
    transform = crop_transform(f.input_size, f.resize, f.crops)
    module, _ = extractor_module(f)
    session = ort.InferenceSession(export(module, f.input_size), providers=["CPUExecutionProvider"])  # ORT's defaults
    network = prepare_for_inference(module, torch.device("cpu"))

    def decode(chunk):
        out = []
        for path in chunk:
            with Image.open(path) as image:
                out.append(transform(image.convert("RGB")))
        return torch.stack(out)

    def ort_run(crops):
        return session.run(None, {"crops": np.ascontiguousarray(crops.flatten(0, 1).numpy())})[0]

    def bare() -> dict:
        t = time.perf_counter()
        decoded = [decode(paths[b : b + batch]) for b in range(0, n, batch)]
        times = {"decode": time.perf_counter() - t}
        t = time.perf_counter()
        for crops in decoded:
            ort_run(crops)
        times["ort"] = time.perf_counter() - t
        t = time.perf_counter()
        with torch.inference_mode():
            for crops in decoded:
                extract(network, crops)
        times["torch"] = time.perf_counter() - t
        t = time.perf_counter()
        for b in range(0, n, batch):  # what the stage does, bare: decode a batch, run it
            ort_run(decode(paths[b : b + batch]))
        times["decode+ort"] = time.perf_counter() - t
        return times

    def stage(k: int) -> float:
        work = Workdir.at(scratch / f"features-{k}")
        catalog_with(work, paths)
        Catalog(work).write_extractor_info("bench", "bench-extractor", {"numerics": numerics(device, engine_for(f, device))})
        shard = {"name": "bench", "images": [(p.stem, str(p), None) for p in paths], "offset": 0}
        return extract_shard(str(work.root), asdict(f), "bench", "bench-extractor", shard, n)["seconds"]

    ort_run(decode(paths[:batch]))  # warm-up: the session's first run, the files in the page cache
    stage(0)
    first = bare()
    shard = stage(1)
    second = bare()
    mean = {k: (first[k] + second[k]) / 2 for k in first}
    rate = {k: n / v for k, v in mean.items()}
    spread = max(abs(first[k] - second[k]) / mean[k] for k in first)
    print(f"\n2. features, {n} images, {f.arch} {f.crops}x{f.input_size}px, batch {batch}, {threads} threads, "
          f"engine {engine_for(f, device)}")  # fmt: skip
    print(f"   stage's shard path {n / shard:7.1f} images/s")
    print(f"   bare decode + ORT  {rate['decode+ort']:7.1f} images/s   (decode alone {rate['decode']:.1f}, "
          f"ORT alone {rate['ort']:.1f}, PyTorch alone {rate['torch']:.1f}; the two bare runs differ by up to "
          f"{100 * spread:.0f}%)")  # fmt: skip
    ratio = (n / shard) / rate["decode+ort"]
    print(f"   stage / bare decode + ORT = {ratio:.2f}   (target >= 0.9); stage / ORT alone = "
          f"{(n / shard) / rate['ort']:.2f}", flush=True)  # fmt: skip
    return {"images": n, "stage_per_s": n / shard, "bare_per_s": rate, "ratio": ratio}


# -- 3. training --------------------------------------------------------------------------


def bare_training(cfg, workdir: Path, dataset: str, mode: str, steps: int) -> dict:
    """Seconds of the bare loop for one epoch before mining starts and one after (or `steps`
    steps of each, scaled to an epoch), and the steps an epoch has."""
    import torch

    from mule.data_catalog.splits import load_split, load_vocabulary
    from mule.data_catalog.tables import Catalog
    from mule.mule_core.devices import resolve_device, use_cpu_threads
    from mule.mule_core.model import build_model
    from mule.mule_core.training.joint import JointTrainer
    from mule.mule_core.training.lp import LPTrainer
    from mule.storage.workdir import Workdir

    catalog = Catalog(Workdir.at(workdir), read_only=True)
    joint = mode == "joint"
    vocabulary = load_vocabulary(catalog, dataset, cfg.data.languages, cfg.model)
    extractor = catalog.require_current_extractor(dataset, cfg.features) if joint else None
    train = load_split(catalog, dataset, "train", vocabulary, cfg.text.max_tokens, extractor, cfg.data.captions)
    device = resolve_device(cfg.train.device)
    use_cpu_threads(cfg.train.threads)
    torch.manual_seed(cfg.train.seed)
    model = build_model(cfg.model, vocabulary, image_dim=train.features.shape[1] if joint else None)
    if joint:
        model.set_image_normalization(train.features)
    if joint:
        trainer = JointTrainer(model, train, cfg.loss, cfg.train, device)
    else:
        trainer = LPTrainer(model, train, cfg.loss, cfg.train, device, pretrain=cfg.pretrain)
    params = [p for p in (model.parameters() if joint else model.mule_parameters()) if p.requires_grad]
    per_epoch = len(trainer.sampler)

    # the weight average (train.ema), done bare: every parameter lerped towards the live
    # weights after each step, as torch's own EMA helpers do (swa_utils: _foreach_lerp_)
    decay = cfg.pretrain.ema if not joint else cfg.train.ema
    live = [p for p in model.parameters()]
    averaged = [p.detach().clone() for p in live] if decay > 0 else []

    def loop(epoch: int, limit: int = steps, average: bool = False) -> float:
        model.train()
        done, started = 0, time.perf_counter()
        for batch in trainer.sampler.batches(epoch):
            parts = trainer.losses(batch)
            total = sum(v for k, v in parts.items() if k != "lc_accuracy")
            trainer.optimizer.zero_grad(set_to_none=True)
            total.backward()
            if trainer.updates.dense_tables is not None:
                trainer.updates.dense_tables.gradients()
            if cfg.train.grad_clip > 0:
                torch.nn.utils.clip_grad_norm_([p for p in params if p.grad is not None], cfg.train.grad_clip)
            trainer.optimizer.step()
            trainer.scheduler.step()
            if average and averaged:
                with torch.no_grad():
                    torch._foreach_lerp_(averaged, [p.detach() for p in live], 1.0 - decay)
            done += 1
            if limit and done == limit:
                break
        return (time.perf_counter() - started) * per_epoch / done

    loop(1, 3)  # untimed: the first steps' allocations and the libraries' lazy set-up
    warm = loop(1)
    trainer.scheduler.last_epoch = max(trainer.scheduler.last_epoch, trainer.mining_warmup_steps)
    mining = loop(2)
    averaging = loop(3, average=True) if averaged else mining  # after mining starts, with the average
    return {"warm_s": warm, "mining_s": mining, "averaging_s": averaging, "steps_per_epoch": per_epoch,
            "mining_from": trainer.mining_warmup_steps, "averaged_floats": sum(p.numel() for p in averaged)}  # fmt: skip


def training_ratio(args, cfg, workdir: Path, dataset: str, steps: int) -> dict:
    """Per stage: the bare loop, the stage forced to run again as a user would (`--force
    STAGE`: in its flow, with its tracking and hooks), the bare loop again."""
    out = {}
    print(f"\n3. training: the stage's seconds per epoch, forced again, over a bare loop ({'a whole epoch' if not steps else f'{steps} steps'} "
          "of each phase before and after mining starts, weighted as the stage's epochs were; bare, stage, bare)")  # fmt: skip
    for stage, mode in (("pretrain", "lp"), ("train", "joint")):
        if stage not in args.train_stages.split(","):
            continue
        if stage not in records(workdir, dataset):
            print(f"   {stage}: not in this rebuild")
            continue
        first = bare_training(cfg, workdir, dataset, mode, steps)
        timed([*command(args, workdir), "--force", stage], workdir.parent / f"{workdir.name}-force-{stage}.log")
        record = records(workdir, dataset)[stage]
        second = bare_training(cfg, workdir, dataset, mode, steps)
        result = record.get("result") or {}
        history = result.get("history") or []
        epochs, per_epoch = len(history), first["steps_per_epoch"]
        total_steps = epochs * per_epoch
        warm_steps = min(first["mining_from"], total_steps)

        both = [(warm_steps * b["warm_s"] + (total_steps - warm_steps) * b["mining_s"]) / per_epoch for b in (first, second)]
        bare_s = sum(both) / 2
        spread = abs(both[0] - both[1]) / bare_s
        # the same loop with the weight average done bare too: what of the gap is the average's
        average_s = sum(b["averaging_s"] - b["mining_s"] for b in (first, second)) / 2 * epochs
        stage_s = float(result.get("seconds") or record.get("seconds"))
        loops = sum(float(h.get("seconds") or 0.0) for h in history)
        phases = result.get("phases") or {}
        ratio = bare_s / stage_s
        print(f"   {stage:<8} {epochs} epochs of {per_epoch} steps: stage {stage_s / epochs:6.2f} s/epoch (its loops "
              f"{loops / epochs:.2f}, validation {phases.get('validation', 0) / epochs:.2f}), bare {bare_s / epochs:6.2f} "
              f"(the two differ by {100 * spread:.0f}%)   bare / stage = {ratio:.2f}   (target >= 0.9)", flush=True)  # fmt: skip
        if first["averaged_floats"]:
            print(f"            the weight average done bare ({first['averaged_floats'] / 1e6:.1f} M floats a step) adds "
                  f"{average_s / epochs:.2f} s/epoch: bare with it / stage = {(bare_s + average_s) / stage_s:.2f}",
                  flush=True)  # fmt: skip
        out[stage] = {"stage_s": stage_s, "loops_s": loops, "bare_s": bare_s, "epochs": epochs, "ratio": ratio,
                      "bare_spread": spread, "phases": phases, "bare_average_s": average_s,
                      "ratio_with_average": (bare_s + average_s) / stage_s}  # fmt: skip
    return out


# -- 4. no change -------------------------------------------------------------------------


def last_write_after(path: Path, returned: float, watch_s: float) -> float | None:
    """Seconds after `returned` (time.time()) that `path` (or its -wal/-journal) was last
    written, watched for watch_s; None: not written after it."""
    deadline = time.time() + watch_s
    last = None
    while time.time() < deadline:
        for f in (path, path.with_name(path.name + "-wal"), path.with_name(path.name + "-journal")):
            try:
                mtime = f.stat().st_mtime
            except OSError:
                continue
            if mtime > returned:
                last = max(last or 0.0, mtime - returned)
        time.sleep(0.1)
    return last


def no_change_ratio(args, workdir: Path, repeats: int) -> dict:
    cmd = command(args, workdir)
    times: dict[str, list[float]] = {"pass": [], "import": [], "no change": []}
    late = None
    for r in range(repeats):
        times["pass"].append(timed([sys.executable, "-c", "pass"]))
        times["import"].append(timed([sys.executable, "-c", "import mule.commands.main"]))
        times["no change"].append(timed(cmd, workdir.parent / f"{workdir.name}-nochange.log"))
        if r == 0:
            late = last_write_after(workdir / "mlflow.db", time.time(), 8.0)
    median = {k: statistics.median(v) for k, v in times.items()}
    print(f"\n4. no change, median of {repeats}: the command {median['no change']:.2f} s, "
          f"`import mule.commands.main` {median['import']:.2f} s, `python -c pass` {median['pass']:.3f} s")  # fmt: skip
    print(f"   no change / import = {median['no change'] / median['import']:.2f}   (target <= 2); "
          f"/ pass = {median['no change'] / median['pass']:.0f}; mlflow.db "
          f"{'not written after the command returned' if late is None else f'last written {late:.1f} s after it returned'}",
          flush=True)  # fmt: skip
    return {"median_s": median, "ratio": median["no change"] / median["import"], "mlflow_written_after_s": late}


def bare_matmul_flops(n: int = 2048, repeats: int = 5) -> float:
    """FLOP/s of a float32 n x n matmul on torch's threads (the best of `repeats`)."""
    import torch

    a, b = torch.randn(n, n), torch.randn(n, n)
    torch.mm(a, b)
    best = min(_seconds(lambda: torch.mm(a, b)) for _ in range(repeats))
    return 2 * n**3 / best


def bare_bandwidth(mib: int = 512, repeats: int = 5) -> float:
    """Bytes/s of a bare elementwise pass (z = x + y: two read, one written) over `mib` MiB
    tensors, the best of `repeats`."""
    import torch

    n = mib * 2**20 // 4
    x, y, z = torch.randn(n), torch.randn(n), torch.empty(n)
    torch.add(x, y, out=z)
    best = min(_seconds(lambda: torch.add(x, y, out=z)) for _ in range(repeats))
    return 3 * n * 4 / best


def _seconds(work) -> float:
    started = time.perf_counter()
    work()
    return time.perf_counter() - started


def machine_ratio(cfg, workdir: Path, dataset: str, steps: int = 10) -> dict:
    """A joint step of the real trainer (after mining starts): its matmul FLOPs and seconds,
    against a bare matmul's FLOP/s; the optimizer's and the average's bytes against a bare
    elementwise pass's bandwidth."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    from mule.data_catalog.splits import load_split, load_vocabulary
    from mule.data_catalog.tables import Catalog
    from mule.mule_core.devices import resolve_device, use_cpu_threads
    from mule.mule_core.model import build_model
    from mule.mule_core.training.joint import JointTrainer
    from mule.storage.workdir import Workdir

    catalog = Catalog(Workdir.at(workdir), read_only=True)
    vocabulary = load_vocabulary(catalog, dataset, cfg.data.languages, cfg.model)
    extractor = catalog.require_current_extractor(dataset, cfg.features)
    train = load_split(catalog, dataset, "train", vocabulary, cfg.text.max_tokens, extractor, cfg.data.captions)
    device = resolve_device(cfg.train.device)
    threads = use_cpu_threads(cfg.train.threads)
    torch.manual_seed(cfg.train.seed)
    model = build_model(cfg.model, vocabulary, image_dim=train.features.shape[1])
    model.set_image_normalization(train.features)
    trainer = JointTrainer(model, train, cfg.loss, cfg.train, device)
    trainer.scheduler.last_epoch = trainer.mining_warmup_steps  # the top-k phase, where most steps are
    batches = iter(trainer.sampler.batches(2))
    model.train()
    for _ in range(3):  # untimed: allocations and lazy set-up
        trainer._step(next(batches), lambda phase: None)
    with FlopCounterMode(display=False) as counter:  # one step's forward and backward, counted
        parts = trainer.losses(next(batches))
        sum(v for k, v in parts.items() if k != "lc_accuracy").backward()
    flops = counter.get_total_flops()
    trainer.optimizer.zero_grad(set_to_none=True)
    started = time.perf_counter()
    for _ in range(steps):
        trainer._step(next(batches), lambda phase: None)
    step_s = (time.perf_counter() - started) / steps
    # train.word_updates=rows: a table (updates.tables, empty when dense) steps, and its average
    # moves, only the rows the last batch read; every other parameter whole
    read = {id(p): p.grad.coalesce().values().numel() for p in trainer.updates.tables if p.grad is not None}
    stepped = sum(read.get(id(p), p.numel()) for group in trainer.optimizer.param_groups for p in group["params"])
    averaged = 0 if trainer.average is None else (sum(a.numel() for a, _ in trainer.average.pairs)
                                                  + sum(read.get(key, 0) for key in trainer.average.rows))  # fmt: skip
    moved = 4 * (7 * stepped + 3 * averaged)  # float32: Adam 4 read + 3 written, the average 2 + 1
    matmul, bandwidth = bare_matmul_flops(), bare_bandwidth()
    rate = flops / step_s
    print(f"\n5. the machine: a joint step ({threads} threads, batch {cfg.train.batch_images} images, mining on, "
          f"train.word_updates={cfg.train.word_updates}), {step_s * 1000:.0f} ms a step")
    print(f"   arithmetic: {flops / 1e9:.2f} GFLOP a step (matrix products, forward and backward) = {rate / 1e9:.1f} "
          f"GFLOP/s; a bare {2048}x{2048} float32 matmul {matmul / 1e9:.1f} GFLOP/s: step / matmul = {rate / matmul:.2f}")
    print(f"   memory: the optimizer and the average move {moved / 1e9:.2f} GB a step ({stepped / 1e6:.1f} M parameters "
          f"stepped, {averaged / 1e6:.1f} M averaged); a bare elementwise pass {bandwidth / 1e9:.1f} GB/s, so "
          f"{moved / bandwidth * 1000:.0f} ms of the step ({moved / bandwidth / step_s:.0%}) at best")  # fmt: skip
    return {"word_updates": cfg.train.word_updates, "step_s": step_s, "flops": flops, "flop_rate": rate, "matmul_flop_rate": matmul,
            "bytes_moved": moved, "bandwidth": bandwidth, "stepped": stepped, "averaged": averaged}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workdir", type=Path, help="an empty folder (default: a new temporary one)")
    parser.add_argument("--dataset", default="", help="a dataset other than the embedded one (with --source)")
    parser.add_argument("--source", default="")
    parser.add_argument("--images", default="")
    parser.add_argument("--preset", default="")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--feature-images", type=int, default=600)
    parser.add_argument("--steps", type=int, default=0, help="bare training steps per phase (0: a whole epoch)")
    parser.add_argument("--ratios", default="12345", help="which figures to measure (default: all five)")
    parser.add_argument("--train-stages", default="pretrain,train", help="the stages of ratio 3")
    parser.add_argument("--built", action="store_true",
                        help="the workdir was built by this command already: ratio 1 is not measured, the others are")
    parser.add_argument("--json", type=Path, help="write the figures here too")
    args = parser.parse_args()
    if args.dataset and not args.source:
        parser.error("--dataset needs --source")
    import torch

    from mule.config.overrides import apply_overrides, from_dict

    print(f"machine: {platform.node()}, {cpu_line()}, torch {torch.__version__} ({torch.get_num_threads()} threads), "
          f"{time.strftime('%Y-%m-%d %H:%M')}", flush=True)  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="mule-limits-") as tmp:
        workdir = (args.workdir or Path(tmp) / "work").resolve()
        if args.built and not args.workdir:
            parser.error("--built needs --workdir")
        if not args.built and workdir.exists() and any(workdir.iterdir()):
            raise SystemExit(f"{workdir} is not empty: the first ratio is a rebuild from nothing (--built skips it)")
        workdir.mkdir(parents=True, exist_ok=True)
        dataset = args.dataset or "embedded"
        figures = {"cpu": cpu_line(), "command": " ".join(command(args, workdir)[1:])}
        if args.built:
            print("\n1. rebuild: not measured (--built)")
        elif "1" in args.ratios:
            figures["rebuild"] = rebuild_ratio(args, workdir, dataset)
        else:
            timed(command(args, workdir), workdir.parent / f"{workdir.name}-rebuild.log")
        model_file = workdir / "models" / dataset / "model.pt"
        cfg = from_dict(torch.load(model_file, map_location="cpu", weights_only=True)["config"])
        if "5" in args.ratios and args.set:  # the step measured under the options given (train.word_updates=rows)
            cfg = apply_overrides(cfg, dict(item.split("=", 1) for item in args.set))
        if "2" in args.ratios:
            figures["features"] = features_ratio(cfg, workdir, dataset, args.feature_images, Path(tmp))
        if "3" in args.ratios:
            figures["training"] = training_ratio(args, cfg, workdir, dataset, args.steps)
        if "4" in args.ratios:
            figures["no_change"] = no_change_ratio(args, workdir, args.repeats)
        if "5" in args.ratios:
            figures["machine"] = machine_ratio(cfg, workdir, dataset)
    if args.json:
        args.json.write_text(json.dumps(figures, indent=1))


if __name__ == "__main__":
    main()
