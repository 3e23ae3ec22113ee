"""`mule demo` as a user runs it: a new process on a workdir, timed from the outside.
Shared by the benchmarks that time whole demo runs."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def empty_workdir(keep: str | None) -> Path:
    """The workdir to use: `keep`, or a temporary one; it must be empty."""
    workdir = Path(keep) if keep else Path(tempfile.mkdtemp(prefix="mule-bench-"))
    if workdir.exists() and any(workdir.iterdir()):
        sys.exit(f"{workdir} is not empty: the benchmark starts from an empty workdir")
    return workdir


def run_demo(workdir: Path, extra: list[str]) -> tuple[float, str]:
    """(wall seconds, stdout) of `mule demo --workdir workdir *extra`; exits on failure."""
    mule = shutil.which("mule") or sys.exit("`mule` is not on PATH: install the package first")
    env = dict(os.environ, PREFECT_HOME=str(workdir / "prefect"))
    env.pop("PREFECT_API_URL", None)  # mule's own temporary server, as on a fresh machine
    started = time.perf_counter()
    process = subprocess.run([mule, "demo", "--workdir", str(workdir), *extra], env=env, capture_output=True, text=True)
    wall = time.perf_counter() - started
    if process.returncode != 0:
        print(process.stdout[-3000:], process.stderr[-3000:])
        sys.exit(f"mule demo failed with exit code {process.returncode}")
    return wall, process.stdout
