"""How long `mule demo` takes to go after Ctrl-C or SIGTERM, at each stage, and what it prints.

    python bench/interrupts.py [--workdir /tmp/mule-interrupts] [--stages features train]
                               [--train-images 600] [--delay 0.5] [--no-rerun] [--debug]
                               [--repeat 1] [--busy 0]

For each stage and each way of stopping (SIGINT to the process group, as a terminal's
Ctrl-C; SIGINT to mule alone; SIGTERM to mule alone, as `timeout`, systemd or a container
stop), a fresh workdir runs `mule demo` until the stage's "ran" line, then 0.5 s on, the
signal. Printed: seconds from the signal to the process's end, the exit code, how it
ended (unwound: the stage raised and everything after it ran; deadline: stopping.interrupts'
watchdog ended it after its grace; --debug adds where the main thread was then), and the
lines printed after the signal. Then the same
command is run again, and its test recalls compared with an uninterrupted run's.
--repeat stops each case that many times (a stop slow one time in four needs a dozen);
--busy N keeps N pure-Python loops spinning beside it, as the other pytest worker does.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

SETS = {"data.image_size": 48, "features.input_size": 32, "vectors.fasttext_epochs": 3, "pretrain.epochs": 6,
        "pretrain.batch_images": 16, "train.epochs": 12, "train.batch_images": 16, "eval.examples": 1,
        "features.shard_images": 64}  # fmt: skip
STAGES = ("ingest", "translate", "features", "text", "pretrain", "train", "evaluate")
WAYS = {"Ctrl-C (group)": (signal.SIGINT, True), "SIGINT (mule)": (signal.SIGINT, False),
        "SIGTERM (mule)": (signal.SIGTERM, False)}  # fmt: skip


def command(workdir: Path, images: int) -> list[str]:
    sets = [a for k, v in SETS.items() for a in ("--set", f"{k}={v}")]
    sizes = ["--train-images", str(images), "--val-images", "50", "--test-images", "100"]
    return [str(Path(sys.executable).with_name("mule")), "demo", "--workdir", str(workdir), *sizes, *sets]


def table(output: str) -> str:
    rows = re.findall(r"^\| (\w+) \| [\d.]+ \| [\d.]+ \| [\d.]+ \| [\d.]+ \| [\d.]+ \| [\d.]+ \| ([\d.]+) \|$", output, re.M)
    return " ".join(f"{lang} {mr}" for lang, mr in rows)


def stop_at(workdir: Path, stage: str, signum: int, group: bool, images: int, delay: float,
            debug: bool = False) -> dict:  # fmt: skip
    env = {**os.environ, "MULE_INTERRUPT_DEBUG": "1"}
    process = subprocess.Popen(command(workdir, images), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               start_new_session=True, env=env)  # fmt: skip
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(process.stdout), daemon=True)
    reader.start()
    marker = re.compile(rf"^(\d\d:\d\d:\d\d |.*mule\.pipeline - ){stage}: ran\b")  # the console's line, or the old format
    sent_at, seen = None, 0
    while process.poll() is None:
        if any(marker.search(line) for line in lines):
            time.sleep(delay)
            seen = len(lines)
            sent_at = time.monotonic()
            (os.killpg if group else os.kill)(process.pid, signum)
            break
        time.sleep(0.02)
    try:
        process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
    reader.join(2)
    took = time.monotonic() - sent_at if sent_at else None
    after = [line.rstrip() for line in lines[seen:]]
    path = "deadline" if any("deadline" in line for line in after) else "unwound"
    if path == "unwound" and any("raised again" in line for line in after):
        path = "unwound (a finaliser swallowed the stop; raised again)"
    said = [line for line in after if debug or not line.startswith("[interrupts")]
    return {"took": took, "code": process.returncode, "path": path, "said": said}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", default="/tmp/mule-interrupts")
    parser.add_argument("--stages", nargs="+", default=list(STAGES))
    parser.add_argument("--ways", nargs="+", default=list(WAYS), choices=list(WAYS))
    parser.add_argument("--train-images", type=int, default=600)
    parser.add_argument("--delay", type=float, default=0.5, help="seconds after the stage's first line")
    parser.add_argument("--no-rerun", action="store_true", help="skip the rerun and its comparison")
    parser.add_argument("--debug", action="store_true",
                        help="the watchdog's lines too (where each thread was at its deadline)")  # fmt: skip
    parser.add_argument("--repeat", type=int, default=1, help="stops of each case")
    parser.add_argument("--busy", type=int, default=0, help="busy loops beside it (a loaded machine)")
    args = parser.parse_args()
    busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(args.busy)]
    try:
        return _run(args)
    finally:
        for loop in busy:
            loop.kill()


def _run(args) -> int:
    root = Path(args.workdir)
    reference = None
    if not args.no_rerun:
        shutil.rmtree(root / "uninterrupted", ignore_errors=True)
        done = subprocess.run(command(root / "uninterrupted", args.train_images), capture_output=True, text=True)
        reference = table(done.stdout)
        print(f"uninterrupted run: test mR {reference}", flush=True)
    print("| stopped | at stage | s to exit | exit | ended by | printed after the signal | rerun |")
    print("|---|---|---|---|---|---|---|", flush=True)
    for way in args.ways:
        signum, group = WAYS[way]
        for stage in [s for s in args.stages for _ in range(args.repeat)]:
            workdir = root / "case"
            shutil.rmtree(workdir, ignore_errors=True)
            got = stop_at(workdir, stage, signum, group, args.train_images, args.delay, args.debug)
            rerun = ""
            if not args.no_rerun and got["took"] is not None:
                again = subprocess.run(command(workdir, args.train_images), capture_output=True, text=True)
                same = table(again.stdout) == reference
                rerun = f"exit {again.returncode}, " + ("same recalls" if same else f"DIFFERENT: {table(again.stdout)}")
            took = f"{got['took']:.2f}" if got["took"] is not None else "(stage not reached)"
            said = " / ".join(got["said"])[:300].replace("|", "/")
            print(f"| {way} | {stage} | {took} | {got['code']} | {got['path']} | {said} | {rerun} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
