"""Where `mule demo`'s time goes: seconds per stage and, inside LP and joint training, per
phase (sampling batches, forward, backward, optimizer, validation), peak memory and the
test recall, for this checkout and, run right after it on the same machine, for a commit
you name (this VM's speed drifts from hour to hour: compare within one run of this script).

    python bench/stage_times.py [--baseline COMMIT [--alternate]] [--size demo|29k|real-text|real] [--set KEY=VALUE ...] [--runs 1] [--log FILE]

--size 29k: Multi30K's size (29,000 / 1,014 / 1,000 images) instead of the demo's 3,000 /
500 / 1,000, with the default preset (the demo preset is sized for the demo). --size
real-text: the real Multi30K text's LP pipeline (`mule run ingest text pretrain evaluate
--dataset multi30k --source ../shared/datasets/multi30k`, or --source), whose recall is
test_2016's en->x R@1 at the MULE layer (their mean). --size real: the real text with the
937 real photographs, as docs/real-photos.md runs it (`mule run all --dataset multi30k
--source ../shared/datasets/multi30k --images ../shared/datasets/flickr-photos/images`),
whose recall is the 31 photographed test images' mean mR. Each run starts from an empty workdir (under --root, default a temporary
folder) and runs the command a user runs; the baseline runs from a git worktree of that
commit with this interpreter (its code, these libraries); --alternate runs the baseline,
this checkout, then the baseline again (this VM drifts within the hour). Per stage: the
seconds it computed (its record's), and when it ended, counted from the command's start; phases come from the stage's own record
(commits from 2026-11-25 on record them).

Before each run the script waits (up to --quiet-wait seconds) until the load average of
the last minute is below 0.5: commits before 2026-11-26 slept their idle OpenMP threads
whenever it was at least that, so a run started right after another would be measured
with a setting the user's first run does not get (the demo's training 45% slower).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SIZES = {"demo": [], "29k": ["--train-images", "29000", "--val-images", "1014", "--test-images", "1000"], "real-text": [],
         "real": []}  # fmt: skip
REAL_TEXT = REPO.parent / "shared" / "datasets" / "multi30k"
REAL_PHOTOS = REPO.parent / "shared" / "datasets" / "flickr-photos" / "images"
STAGES = ("ingest", "translate", "features", "text", "pretrain", "train", "evaluate", "index")
# Runs a checkout's `mule` with this interpreter: mule.<folder> maps onto the checkout's folders
RUNNER = """
import sys, types
root = sys.argv[1]
package = types.ModuleType("mule"); package.__path__ = [root]; sys.modules["mule"] = package
sys.argv = ["mule", *sys.argv[2:]]
try:
    from mule.commands.main import entry
except ImportError:  # a checkout from before the commands had a package of their own
    from mule.flows.cli import entry
entry()
"""


def tree_rss_mb(pid: int) -> float:
    import psutil

    try:
        process = psutil.Process(pid)
        return sum(p.memory_info().rss for p in [process, *process.children(recursive=True)]) / 2**20
    except psutil.Error:
        return 0.0


def wait_quiet(limit_s: float) -> None:
    """Until the last minute's load average is below 0.5 (or limit_s has passed)."""
    started = time.time()
    while os.getloadavg()[0] >= 0.5 and time.time() - started < limit_s:
        time.sleep(5)
    print(f"  waited {time.time() - started:.0f} s for a quiet machine (load average {os.getloadavg()[0]:.2f})",
          flush=True)  # fmt: skip


def preset_args(checkout: Path, size: str, preset: str | None = None) -> list[str]:
    """The 29k figures are the defaults' (`--preset default`); a checkout from before the
    demo preset differed from the defaults (2026-11-26) has the defaults as its demo."""
    if preset:
        return ["--preset", preset]
    if size != "29k":
        return []
    if (checkout / "config" / "resolution.py").exists():  # the config's room (2026-11-27 on): "default" is a preset
        return ["--preset", "default"]
    config = checkout / "pipeline" / "config.py"  # older checkouts kept their presets elsewhere: defaults then
    return ["--preset", "default"] if config.exists() and '"default": {}' in config.read_text() else []


def mule_command(size: str, source: Path, images: Path = REAL_PHOTOS) -> tuple[list[str], str]:
    """The command's arguments after `mule`, and the dataset it builds."""
    if size == "real-text":
        return ["run", "ingest", "text", "pretrain", "evaluate", "--dataset", "multi30k", "--source", str(source)], "multi30k"
    if size == "real":
        return ["run", "all", "--dataset", "multi30k", "--source", str(source), "--images", str(images)], "multi30k"
    return ["demo", *SIZES[size]], "embedded"


def english_r1(evaluation: dict) -> dict[str, float]:
    """Without images (the real text): en->x R@1 at the MULE layer; with images, nothing."""
    if evaluation.get("mean_mR") is not None:
        return {}
    pairs = (evaluation.get("cross_lingual") or {}).get("mule") or {}
    return {pair: r["r1"] for pair, r in pairs.items() if pair.startswith("en->")}


def headline_recall(evaluation: dict) -> float | None:
    """The demo's mean mR; without images, the mean of en->x R@1 at the MULE layer."""
    english = english_r1(evaluation)
    return sum(english.values()) / len(english) if english else evaluation.get("mean_mR")


def run_demo(checkout: Path, workdir: Path, size: str, sets: list[str], preset: str | None = None,
             log: Path | None = None, source: Path = REAL_TEXT, images: Path = REAL_PHOTOS) -> dict:
    """The command (`mule demo`, or the real text's LP pipeline) from an empty workdir: wall
    seconds, peak RSS (the process tree's), stage times. With `log`, the command's output is
    appended there line by line as it comes (a run cut off by a time limit still shows how far it got)."""
    arguments, dataset = mule_command(size, source, images)
    command = [sys.executable, "-c", RUNNER, str(checkout), *arguments, "--workdir", str(workdir),
               *preset_args(checkout, size, preset), *[a for s in sets for a in ("--set", s)]]  # fmt: skip
    started = time.time()
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    process = subprocess.Popen(command, cwd=checkout, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    peak = [0.0, 0.0]  # MB, and when (seconds since the start)

    def watch() -> None:
        while process.poll() is None:
            now = tree_rss_mb(process.pid)
            if now > peak[0]:
                peak[:] = [now, time.time() - started]
            time.sleep(0.5)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    lines = []
    with open(log, "a") if log else open(os.devnull, "w") as sink:
        for line in process.stdout:
            lines.append(line)
            sink.write(f"{time.time() - started:7.1f} s  {line}")
            sink.flush()
    process.wait()
    output = "".join(lines)
    wall = time.time() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)  # every process the command ran, their threads
    cpu = (after.ru_utime - children.ru_utime) + (after.ru_stime - children.ru_stime)
    watcher.join(2)
    if process.returncode != 0:
        sys.exit(f"`mule {arguments[0]}` in {checkout} failed ({process.returncode}):\n{output[-3000:]}")
    records = {}
    for stage in STAGES:
        folder = workdir / "state" / "stages" / dataset
        # a stage run in a variant has it in its record's name (pretrain.pretrain.human-mt.json)
        paths = [folder / f"{stage}.json", *sorted(folder.glob(f"{stage}.*.json"))]
        found = [path for path in paths if path.exists()]
        if found:
            records[stage] = json.loads(found[0].read_text())
    ended = {stage: records[stage]["finished"] - started for stage in STAGES if stage in records}
    previous = started + max(ended.values(), default=0.0)
    evaluation = json.loads((workdir / "results" / dataset / "evaluation.json").read_text())
    phases = {stage: (records.get(stage, {}).get("result") or {}).get("phases") for stage in ("pretrain", "train")}
    return {"wall": wall, "cpu": cpu, "peak_mb": peak[0], "peak_at": peak[1], "ended": ended, "phases": phases,
            "compute": {s: r.get("seconds") for s, r in records.items()},
            # the stage's process's CPU-seconds over its computation (records from 2026-12-07 on)
            "compute_cpu": {s: r.get("cpu_seconds") for s, r in records.items()},
            "mR": headline_recall(evaluation), "en->x R@1": english_r1(evaluation),
            "after_last_stage": started + wall - previous}  # fmt: skip


def worktree(commit: str, root: Path) -> Path:
    path = root / f"baseline-{commit[:12]}"
    if not path.exists():
        subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", str(path), commit], check=True,
                       capture_output=True)  # fmt: skip
    return path


def remove_worktree(path: Path) -> None:
    subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(path)], capture_output=True)


def table(results: dict[str, dict]) -> str:
    names = list(results)
    lines = ["| | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]

    def row(label: str, value) -> None:
        cells = []
        for name in names:
            v = value(results[name])
            cells.append("–" if v is None else f"{v:.1f}" if isinstance(v, float) else str(v))
        lines.append(f"| {label} | " + " | ".join(cells) + " |")

    row("**wall s**", lambda r: r["wall"])
    row("**CPU-s** (user + system, every process)", lambda r: r.get("cpu"))
    for stage in STAGES:
        def cell(r, s=stage):
            computed, ended = (r["compute"] or {}).get(s), r["ended"].get(s)
            if ended is None:
                return None
            return f"{computed:.1f} (ended at {ended:.0f})" if computed is not None else f"– (ended at {ended:.0f})"
        row(f"{stage}: computed s (ended at s)", cell)
        row(f"{stage}: CPU-s", lambda r, s=stage: (r.get("compute_cpu") or {}).get(s))
    row("after the last stage s (reports, Prefect's exit)", lambda r: r["after_last_stage"])
    for stage in ("pretrain", "train"):
        for phase in ("batches", "forward", "backward", "optimizer", "validation"):
            row(f"{stage}: {phase} s", lambda r, s=stage, p=phase: (r["phases"].get(s) or {}).get(p))
    row("peak RSS MB (the process tree)", lambda r: r["peak_mb"])
    row("peak RSS: when, s (the stages' ends above say which ran)", lambda r: r.get("peak_at", 0.0))
    if any(r["en->x R@1"] for r in results.values()):  # the real text: no images, R@1 across languages
        for pair in sorted({p for r in results.values() for p in r["en->x R@1"]}):
            row(f"test {pair} R@1 (MULE layer)", lambda r, p=pair: r["en->x R@1"].get(p))
        row("**test mean en->x R@1**", lambda r: r["mR"])
    else:
        row("**test mean mR**", lambda r: r["mR"])
    return "\n".join(lines)


def cpu_model() -> str:
    """The processor's name: a VM that moves to another host runs everything at another
    speed (this one's demo: 108-155 s on one host, 74-82 s on the next), so figures compare
    only on the same one."""
    import platform

    try:
        fields = dict(line.split(":", 1) for line in Path("/proc/cpuinfo").read_text().split("\n\n")[0].splitlines()
                      if ":" in line)  # fmt: skip
    except OSError:
        return platform.processor() or platform.machine()
    fields = {k.strip(): v.strip() for k, v in fields.items()}  # a VM may name only the vendor: its family and model say more
    return f"{fields.get('model name', platform.machine())}, family {fields.get('cpu family', '?')} model {fields.get('model', '?')}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--baseline", help="a commit to run right after this checkout")
    parser.add_argument("--alternate", action="store_true",
                        help="with --baseline: the baseline, this checkout, then the baseline again")
    parser.add_argument("--size", choices=sorted(SIZES), default="demo")
    parser.add_argument("--set", dest="sets", action="append", default=[])
    parser.add_argument("--preset", help="the preset to run (default: the dataset's, `default` for --size 29k)")
    parser.add_argument("--root", type=Path, help="where the workdirs go (kept); default a temporary folder, removed after")
    parser.add_argument("--runs", type=int, default=1, help="runs of each (the table shows the median's run)")
    parser.add_argument("--quiet-wait", type=float, default=300, help="seconds to wait for a quiet machine before a run")
    parser.add_argument("--log", type=Path, help="append each run's output here as it comes, with seconds since its start")
    parser.add_argument("--source", type=Path, default=REAL_TEXT, help="--size real-text: the Multi30K folder")
    parser.add_argument("--images", type=Path, default=REAL_PHOTOS,
                        help="--size real: the photographs' folder (a machine without ../shared: a copy of it)")
    args = parser.parse_args()
    if args.size == "real" and not args.images.is_dir():
        sys.exit(f"--size real needs the real photographs: {args.images} is not a folder (--images)")
    if args.size in ("real-text", "real") and not (args.source / "data").is_dir():
        sys.exit(f"--size real-text needs the official Multi30K files: {args.source / 'data'} is not a folder (--source)")
    root = args.root or Path(tempfile.mkdtemp(prefix="mule-stage-times-"))
    try:
        head = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True).stdout.strip()  # fmt: skip
        dirty = subprocess.run(["git", "-C", str(REPO), "status", "--porcelain"], capture_output=True, text=True).stdout
    except FileNotFoundError:  # a copy of the tree without git (a GPU machine)
        head, dirty = "no git", ""
    checkouts = {f"this checkout ({head}{'+dirty' if dirty.strip() else ''})": REPO}
    if args.baseline:
        base = worktree(args.baseline, root)
        if args.alternate:  # the VM drifts within the hour: baseline, this, baseline
            checkouts = {f"baseline {args.baseline}": base, **checkouts, f"baseline {args.baseline} again": base}
        else:
            checkouts[f"baseline {args.baseline}"] = base
    import platform

    import psutil

    print(f"machine: {platform.node()}, {psutil.cpu_count()} CPUs ({cpu_model()}), {psutil.virtual_memory().total / 2**30:.0f} "
          f"GiB; python {platform.python_version()}; size {args.size}; {time.strftime('%Y-%m-%d %H:%M')}", flush=True)  # fmt: skip
    import torch

    if torch.cuda.is_available():  # the stages' device "auto" then picks it
        print(f"GPU: {torch.cuda.get_device_name(0)}; torch {torch.__version__}", flush=True)
    try:
        results = measure(checkouts, root, args)
    finally:  # the baseline's worktree, and the workdirs unless --root named where (29k: gigabytes)
        if args.baseline:
            remove_worktree(checkouts[f"baseline {args.baseline}"])
        if args.root is None:
            shutil.rmtree(root, ignore_errors=True)
    print("\n" + table(results))


def measure(checkouts: dict[str, Path], root: Path, args) -> dict[str, dict]:
    """Each checkout's runs (args.runs, one after the other): the median run's figures."""
    results = {}
    for name, checkout in checkouts.items():
        runs = []
        for n in range(args.runs):
            workdir = root / f"{name.split()[0]}{'-again' if name.endswith(' again') else ''}-{n}"
            if workdir.exists() and any(workdir.iterdir()):  # its stages would be reused, not timed
                sys.exit(f"{workdir} is not empty: each run starts from an empty workdir (another --root?)")
            print(f"{name}: mule {mule_command(args.size, args.source, args.images)[0][0]} in {workdir} ...", flush=True)
            wait_quiet(args.quiet_wait)
            if args.log:
                with open(args.log, "a") as sink:
                    sink.write(f"== {name}: {workdir}\n")
            runs.append(run_demo(checkout, workdir, args.size, args.sets, args.preset, args.log, args.source, args.images))
            print(f"  {runs[-1]['wall']:.1f} s, test recall {runs[-1]['mR']:.2f}", flush=True)
        results[name] = sorted(runs, key=lambda r: r["wall"])[len(runs) // 2]
    return results


if __name__ == "__main__":
    main()
