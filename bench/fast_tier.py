"""The README's fast tier (`python -m pytest -m "not slow"`): its wall time, and every
module of the package it never imports (a module the fast tier does not touch).

    python bench/fast_tier.py [-- PYTEST_ARGS...]     # default: -m "not slow"

Runs pytest with a plugin (fast_tier_plugin.py beside this file) that writes the mule
modules each worker imported; prints the wall seconds, the tests run, and the package's
modules (every .py under the rooms of pyproject.toml's package-dir) that no worker
imported. The tier's rule (README): at most 2 minutes on the slower 2-core host, every
module touched at least once. State the CPU beside the figure."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
import time
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def package_modules() -> set[str]:
    rooms = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
    found = set()
    for name, folder in rooms.items():
        for path in (REPO / folder).rglob("*.py"):
            parts = path.relative_to(REPO / folder).with_suffix("").parts
            found.add(".".join((name, *parts)).removesuffix(".__init__"))
    return found


def main() -> None:
    args = sys.argv[1:]
    args = args[1:] if args[:1] == ["--"] else args
    args = args or ["-m", "not slow"]
    with tempfile.TemporaryDirectory() as scratch:
        modules_file = Path(scratch) / "modules.jsonl"
        env = os.environ | {"FAST_TIER_MODULES": str(modules_file),
                            "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO / "bench"), os.environ.get("PYTHONPATH")]))}  # fmt: skip
        started = time.monotonic()
        done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "fast_tier_plugin", *args], cwd=REPO,
                              env=env, capture_output=True, text=True)  # fmt: skip
        wall = time.monotonic() - started
        imported = set()
        for line in modules_file.read_text().splitlines() if modules_file.exists() else []:
            imported |= set(json.loads(line))
    summary = next((line for line in reversed(done.stdout.splitlines()) if re.search(r"\d+ (passed|failed)", line)), "")
    untouched = sorted(package_modules() - imported)
    print(f"pytest {' '.join(args)}: {wall:.1f} s wall; {summary.strip('= ')}")
    print(f"package modules never imported: {len(untouched)} of {len(package_modules())}")
    for name in untouched:
        print(f"  {name}")
    slowest = done.stdout.split("slowest", 1)[1].splitlines()[1:9] if "slowest" in done.stdout else []
    if slowest:
        print("its slowest tests (pytest --durations):")
        for line in slowest:
            print(f"  {line}")
    if done.returncode != 0:
        print(done.stdout[-3000:])
        raise SystemExit(done.returncode)


if __name__ == "__main__":
    main()
