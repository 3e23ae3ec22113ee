"""pytest plugin for bench/suite_cpu.py: each test's wall and CPU seconds in its worker
(setup, call and teardown: session fixtures count in the first test that asks for them),
one JSON line per test appended to $SUITE_CPU_TESTS."""

from __future__ import annotations

import json
import os
import resource
import time

import pytest


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    before, started = resource.getrusage(resource.RUSAGE_SELF), time.monotonic()
    yield
    after = resource.getrusage(resource.RUSAGE_SELF)
    cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    path = os.environ.get("SUITE_CPU_TESTS")
    if path:
        with open(path, "a") as out:  # one short line a write: the workers' lines do not interleave
            out.write(json.dumps({"test": item.nodeid, "cpu": cpu, "wall": time.monotonic() - started}) + "\n")
