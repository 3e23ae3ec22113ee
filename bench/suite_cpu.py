"""Where the test suite's CPU time goes: per kind of process, per test file, slow-marked or not.

    python bench/suite_cpu.py [--out suite-cpu.json] [-- PYTEST_ARGS...]
    python bench/suite_cpu.py --report suite-cpu.json    # the tables again, from a saved run

Runs the README's test command (`python -m pytest`, or it with PYTEST_ARGS) and, while it
runs, reads /proc four times a second for every process the suite starts: the pytest
workers, the `mule` commands the tests start or fork, the servers (Prefect, MLflow,
`mule serve`, Chromium), the pipeline's own processes (fastText workers, the deferred
recorder, Dask workers, image loaders). Each process's CPU time is its last reading (a
process that lives less than a reading is missed: the total says how much). A pytest plugin
(suite_cpu_plugin.py beside this file) adds each test's CPU time inside its worker; a
started process is charged to the test it was started under (PYTEST_CURRENT_TEST in its
environment).

Printed: wall and CPU seconds (the suite's whole process tree, from the kernel's
accounting of what pytest waited for, against what the readings saw); CPU per kind of
process; per test file, and for the 15 costliest tests, their own CPU and that of the
processes they started; the tests marked slow against the rest. The suite is CPU-bound on 2 cores when CPU s / wall s
is near 2: then only less CPU makes it shorter.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TICK = os.sysconf("SC_CLK_TCK")


def read_process(pid: str) -> tuple[float, int, int] | None:
    """(CPU s, parent pid, start tick), or None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / TICK, int(fields[1]), int(fields[19])
    except (OSError, ValueError, IndexError):
        return None


def describe(pid: str) -> tuple[str, str]:
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
        environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return "", ""
    test = next((e[len(b"PYTEST_CURRENT_TEST="):].decode(errors="replace") for e in environ
                 if e.startswith(b"PYTEST_CURRENT_TEST=")), "")  # fmt: skip
    return cmdline, test.rsplit(" (", 1)[0]


class Sampler(threading.Thread):
    """Every process descended from `root`, with its latest CPU time."""

    def __init__(self, root: int, every: float = 0.25):
        super().__init__(daemon=True)
        self.root, self.every = root, every
        self.seen: dict[tuple[int, int], dict] = {}  # (pid, start tick) -> record
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.is_set():
            self.sample()
            self.done.wait(self.every)
        self.sample()

    def sample(self) -> None:
        readings = {}
        for pid in os.listdir("/proc"):
            if pid.isdigit():
                reading = read_process(pid)
                if reading:
                    readings[int(pid)] = reading
        ours = {self.root} | {pid for pid, _ in self.seen}
        grew = True
        while grew:  # descendants of the suite (those whose parent is, or was, one of ours)
            grew = False
            for pid, (_, parent, _) in readings.items():
                if pid not in ours and parent in ours:
                    ours.add(pid)
                    grew = True
        for pid in ours:
            if pid not in readings:
                continue
            cpu, parent, start = readings[pid]
            record = self.seen.get((pid, start))
            if record is None:
                cmdline, test = describe(str(pid))
                record = self.seen[(pid, start)] = {"pid": pid, "parent": parent, "cmdline": cmdline, "test": test}
            record["cpu"] = cpu


KINDS = (  # (kind, pattern on the command line), first match wins
    ("pytest workers", r"import sys;exec\(eval\(sys\.stdin"),
    ("pytest", r"-m pytest|pytest/__main__"),
    # before the others: a forked child keeps the forking process's command line, which names the modules it imports
    (
        "tests/forked.py: the forking process and the `mule` commands forked from it",
        r"^\S+ -c\s+import importlib\s+import mule\.commands\.main",
    ),
    ("Prefect servers", r"prefect\.server\.api\.server:create_app|prefect server start|provide_database_interface"),
    ("MLflow servers", r"mlflow server|mlflow ui|mlflow models serve|mlflow\.server|scoring_server"),
    ("fastText workers", r"fasttext_worker"),
    ("deferred recorder", r"mule\.pipeline\.deferred|pipeline/deferred\.py"),
    ("Chromium", r"chrom|playwright"),
    ("Dask", r"distributed|dask"),
    ("mule serve", r"mule\.commands serve|__main__\.py serve|\bserve --workdir"),
    ("mule demo / run (started)", r"mule\.commands (demo|run)|__main__\.py (demo|run)|^mule (demo|run)"),
    ("other mule commands", r"mule\.commands|commands/__main__|^mule "),
    ("multiprocessing (image loaders, Dask's workers, tokenisers)", r"multiprocessing"),
    ("git, dot and other tools", r"^(git|dot|/usr/bin/)"),
)


def kind(cmdline: str) -> str:
    for name, pattern in KINDS:
        if re.search(pattern, cmdline):
            return name
    return "other Python processes the tests start"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, help="every process and test, as JSON")
    parser.add_argument("--report", type=Path, help="print the tables of an earlier run's --out file, run nothing")
    parser.add_argument("pytest_args", nargs="*")
    args = parser.parse_args()
    if args.report:
        saved = json.loads(args.report.read_text())
        report(saved["wall"], saved["cpu"], saved["processes"], saved["tests"], set(saved["slow"]), saved["exit"])
        return 0

    tests_file = Path(tempfile.mkstemp(prefix="suite-cpu-tests-", suffix=".jsonl")[1])
    env = {**os.environ, "SUITE_CPU_TESTS": str(tests_file),
           "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO / "bench"), os.environ.get("PYTHONPATH")]))}  # fmt: skip
    command = [sys.executable, "-m", "pytest", "-p", "suite_cpu_plugin", *args.pytest_args]
    slow = collected_slow(args.pytest_args)
    print(f"$ python {' '.join(command[1:])}", flush=True)
    started = time.monotonic()
    suite = subprocess.Popen(command, cwd=REPO, env=env)
    sampler = Sampler(suite.pid)
    sampler.start()
    _, status, usage = os.wait4(suite.pid, 0)
    wall = time.monotonic() - started
    sampler.done.set()
    sampler.join()
    total = usage.ru_utime + usage.ru_stime  # pytest's, and that of every process it (or one of them) waited for
    processes = list(sampler.seen.values())
    tests = [json.loads(line) for line in tests_file.read_text().splitlines() if line.strip()]
    tests_file.unlink()
    code = os.waitstatus_to_exitcode(status)
    report(wall, total, processes, tests, slow, code)
    if args.out:
        saved = {"wall": wall, "cpu": total, "exit": code, "slow": sorted(slow), "processes": processes, "tests": tests}
        args.out.write_text(json.dumps(saved, indent=1))
    return 0


def collected_slow(pytest_args: list[str]) -> set[str]:
    """The node ids of the tests marked slow (pytest's own selection of them)."""
    done = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-n", "0", "-m", "slow",
                           "-p", "no:cacheprovider", *pytest_args], cwd=REPO, capture_output=True, text=True)  # fmt: skip
    return {line.strip() for line in done.stdout.splitlines() if "::" in line}


def report(wall: float, total: float, processes: list[dict], tests: list[dict], slow: set[str], code: int) -> None:
    seen = sum(r["cpu"] for r in processes)
    print(f"\nexit code {code}; wall {wall:.1f} s; CPU {total:.1f} s (the process tree, the kernel's count; "
          f"{total / wall:.2f} cores busy on average), {seen:.1f} s of it seen in {len(processes)} processes")  # fmt: skip

    by_kind = collections.defaultdict(lambda: [0, 0.0])
    for r in processes:
        entry = by_kind[kind(r["cmdline"])]
        entry[0] += 1
        entry[1] += r["cpu"]
    print("\n| kind of process | processes | CPU s | share |\n|---|---|---|---|")
    for name, (count, cpu) in sorted(by_kind.items(), key=lambda kv: -kv[1][1]):
        print(f"| {name} | {count} | {cpu:.1f} | {100 * cpu / total:.0f}% |")

    per_file = collections.defaultdict(lambda: [0.0, 0.0, 0.0])  # own CPU, started processes' CPU, wall
    per_test_started = collections.defaultdict(float)
    for r in processes:
        if r["test"] and kind(r["cmdline"]) not in ("pytest workers", "pytest"):
            per_test_started[r["test"]] += r["cpu"]
    for t in tests:
        entry = per_file[t["test"].split("::")[0]]
        entry[0] += t["cpu"]
        entry[2] += t["wall"]
    for test, cpu in per_test_started.items():
        per_file[test.split("::")[0]][1] += cpu
    print("\n| test file | tests' own CPU s | their processes' CPU s | tests' wall s |\n|---|---|---|---|")
    for name, (own, started, wall_s) in sorted(per_file.items(), key=lambda kv: -(kv[1][0] + kv[1][1]))[:20]:
        print(f"| {name} | {own:.1f} | {started:.1f} | {wall_s:.1f} |")

    print("\n| test (the 15 costliest) | own CPU s | its processes' CPU s | wall s |\n|---|---|---|---|")
    for t in sorted(tests, key=lambda t: -(t["cpu"] + per_test_started.get(t["test"], 0.0)))[:15]:
        print(f"| {t['test']} | {t['cpu']:.1f} | {per_test_started.get(t['test'], 0.0):.1f} | {t['wall']:.1f} |")

    split = {True: [0, 0.0, 0.0], False: [0, 0.0, 0.0]}
    for t in tests:
        entry = split[t["test"] in slow]
        entry[0] += 1
        entry[1] += t["cpu"] + per_test_started.get(t["test"], 0.0)
        entry[2] += t["wall"]
    print("\n| tests | count | CPU s (own and started) | wall s (summed over workers) |\n|---|---|---|---|")
    for marked, (count, cpu, wall_s) in split.items():
        print(f"| {'marked slow' if marked else 'the rest'} | {count} | {cpu:.1f} | {wall_s:.1f} |")
    rest = total - sum(v[1] for v in split.values())
    print(f"\nNot in a test's count: {rest:.1f} CPU s (collection, session fixtures' servers, processes "
          f"started outside a test or missed between readings).")  # fmt: skip


if __name__ == "__main__":
    raise SystemExit(main())
