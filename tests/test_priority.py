"""A rebuild beside `mule serve` yields the CPU to it when MULE_NICE says so (the scheduled
deployments set 10: prefect.yaml): the flow's body, the threads and processes it starts,
all run that much nicer (bench/serve_beside_rebuild.py measures what it buys)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def niceness_of(script: str, nice: str | None) -> list[str]:
    """The lines `script` prints in a fresh interpreter with MULE_NICE=nice (None: unset)."""
    env = {k: v for k, v in os.environ.items() if k != "MULE_NICE"} | ({"MULE_NICE": nice} if nice is not None else {})
    done = subprocess.run([sys.executable, "-c", script], cwd=REPO, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout.split()


THREADS_AND_CHILDREN = """
import os, subprocess, threading
from mule.flows.environment import yield_to_serving
before = os.getpriority(os.PRIO_PROCESS, 0)
now = yield_to_serving()
seen = []
thread = threading.Thread(target=lambda: seen.append(os.getpriority(os.PRIO_PROCESS, 0)))
thread.start(); thread.join()
child = subprocess.run(["sh", "-c", "cut -d' ' -f19 /proc/self/stat"], capture_output=True, text=True).stdout.strip()
print(before, now, seen[0], child, yield_to_serving())
"""


def test_mule_nice_makes_the_process_its_threads_and_its_children_nicer():
    start = os.getpriority(os.PRIO_PROCESS, 0)
    target = max(start, 7)
    assert niceness_of(THREADS_AND_CHILDREN, "7") == [str(start), *[str(target)] * 4]  # set once, kept
    assert niceness_of(THREADS_AND_CHILDREN, None) == [str(start)] * 5  # unset: nothing changes
    assert niceness_of(THREADS_AND_CHILDREN, "0") == [str(start)] * 5  # never lowered


def test_a_bad_mule_nice_is_a_user_error_naming_it(monkeypatch):
    from mule.flows.environment import yield_to_serving
    from mule.mule_core.settings import ConfigError

    for value, said in (("high", "got 'high'"), ("25", "got 25"), ("-5", "got -5")):
        monkeypatch.setenv("MULE_NICE", value)
        with pytest.raises(ConfigError, match=f"MULE_NICE must be a niceness from 0 to 19, {said}"):
            yield_to_serving()


@pytest.mark.slow
def test_every_mule_flow_body_runs_at_mule_nice(forker, tmp_path):
    """The wrapper of every mule flow's body (flows/stages.py: _failing_quietly) applies it
    before the body runs, in the thread that runs it (forked from a process that has
    imported the flows: tests/forked.py)."""
    script = ("import os\n"
              "from mule.flows.stages import _failing_quietly\n"
              "print(_failing_quietly(lambda: os.getpriority(os.PRIO_PROCESS, 0)))\n")  # fmt: skip
    child = forker.run([], tmp_path / "out.log", env={"MULE_NICE": "9"}, script=script)
    assert child.returncode == 0, child.output()[-3000:]
    assert child.output().split() == [str(max(os.getpriority(os.PRIO_PROCESS, 0), 9))]


def test_the_scheduled_deployments_run_at_niceness_10():
    import yaml

    for deployment in yaml.safe_load((REPO / "prefect.yaml").read_text())["deployments"]:
        assert deployment["work_pool"]["job_variables"]["env"]["MULE_NICE"] == "10", deployment["name"]
