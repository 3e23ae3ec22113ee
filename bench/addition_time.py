"""What adding a language to a trained model costs, through the command a user types:
`mule run add-language` onto a workdir `mule run all` built, its wall and CPU seconds and
each stage's and step's seconds (what ran, what was reused), the added model's bytes.

    python bench/addition_time.py --workdir W --dataset multi30k --source S --images I \
        --lang es [--captions es=FILE ...] [--seed 0] [--cold] [--log FILE] [--set KEY=VALUE ...] \
        [--checkout DIR]

--checkout: run another checkout's `mule` (a worktree of an older commit) with this
interpreter, onto a workdir that checkout built, to set an addition beside today's in one
sitting (run them one after the other: baseline, this, baseline).

--cold: the user's cache starts empty (XDG_CACHE_HOME a new temporary folder), as on a
machine that never added a language: multilingual-e5 reads the language's words (and the
base's commonest) once. Without it, words read before come from ~/.cache/mule. An addition
already made is reused as a whole: give another --seed (or a --set) to time it again.
Prints one line per stage or step ("computed in" or "reused", from the command's own log)
and the totals; --json writes them too.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from stage_times import RUNNER, cpu_model  # bench/ is on the path

LINE = re.compile(r"^\d\d:\d\d:\d\d (?P<stage>[\w-]+): (?:computed in (?P<seconds>[\d.]+) s"
                  r"(?: \((?P<cpu>[\d.]+) CPU-s\))?|(?P<reused>reused))")  # fmt: skip


def stage_lines(log: str) -> list[tuple[str, float | None, float | None]]:
    """(stage, seconds, CPU-seconds) in the order the log says them; None for a stage reused."""
    out = []
    for line in log.splitlines():
        found = LINE.match(line)
        if found:
            out.append((found["stage"], None if found["reused"] else float(found["seconds"]),
                        float(found["cpu"]) if found["cpu"] else None))  # fmt: skip
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workdir", required=True, type=Path)
    parser.add_argument("--dataset", default="multi30k")
    parser.add_argument("--source", required=True)
    parser.add_argument("--images", default="")
    parser.add_argument("--lang", required=True)
    parser.add_argument("--captions", action="append", default=[])
    parser.add_argument("--base-model", default="model")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--cold", action="store_true", help="an empty user cache: e5 reads every word once")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--log", type=Path, help="the command's output (default: beside the workdir)")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--checkout", type=Path, help="another checkout's code (default: this one's)")
    args = parser.parse_args()
    mule = [sys.executable, "-c", RUNNER, str(args.checkout)] if args.checkout else [sys.executable, "-m", "mule.commands.main"]
    # the base and the seed only when not the defaults: an older checkout named those options otherwise
    defaults = (["--set", f"add.base_model={args.base_model}"] if args.base_model != "model" else []) + (
        ["--set", f"train.seed={args.seed}"] if args.seed else [])  # fmt: skip
    command = [*mule, "run", "add-language", "--lang", args.lang,
               "--workdir", str(args.workdir), "--dataset", args.dataset, "--source", args.source,
               *(["--images", args.images] if args.images else []), *defaults,
               *(a for item in args.captions for a in ("--captions", item)),
               *(a for item in args.set for a in ("--set", item))]  # fmt: skip
    env = dict(os.environ)
    with tempfile.TemporaryDirectory(prefix="mule-cold-cache-") as cache:
        if args.cold:
            env["XDG_CACHE_HOME"] = cache
        log = args.log or args.workdir.parent / f"{args.workdir.name}-add-{args.lang}-s{args.seed}.log"
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        started = time.perf_counter()
        with log.open("w") as out:
            code = subprocess.call(command, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=args.checkout)
        wall = time.perf_counter() - started
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if code:
        raise SystemExit(f"mule run add-language failed (exit {code}): see {log}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    stages = stage_lines(log.read_text())
    name = args.base_model + "".join(f"+{x}" for x in args.lang.split(","))
    model = args.workdir / "models" / args.dataset / f"{name}.pt"
    code_of = f"the checkout at {args.checkout}" if args.checkout else "this checkout"
    print(f"{cpu_model()}; {code_of}: mule run add-language --lang {args.lang} onto {args.base_model} "
          f"({len(args.captions)} caption table(s), seed {args.seed}, {'cold' if args.cold else 'warm'} cache)")
    for stage, seconds, cpu_s in stages:
        print(f"  {stage:<20} {'reused' if seconds is None else f'{seconds:8.1f} s, {cpu_s or 0:6.0f} CPU-s'}")
    computed = sum(s for _, s, _ in stages if s is not None)
    print(f"  wall {wall:.1f} s, CPU {cpu:.1f} s (user + system, every process), stages computed {computed:.1f} s; "
          f"{model.name} {model.stat().st_size / 2**20:.1f} MiB; log {log}")  # fmt: skip
    if args.json:
        args.json.write_text(json.dumps({"cpu": cpu_model(), "wall_s": wall, "cpu_s": cpu, "stages": stages,
                                         "cold": args.cold, "checkout": str(args.checkout or ""),
                                         "model_bytes": model.stat().st_size}, indent=1))  # fmt: skip


if __name__ == "__main__":
    main()
