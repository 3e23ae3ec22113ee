"""A pytest plugin: at the end of a run, processes that the tests started and left running
fail it. A test that skips or fails before its cleanup can leave a server behind (`mule
ui`'s MLflow server runs in a session of its own, under a uvicorn whose command line
names nothing of the test: it outlived the suite on its port until 2026-11-28).

Every process a test starts inherits the run's environment, so the run marks it: a
variable with an id of its own (SESSION_VARIABLE), set before pytest-xdist starts its
workers. When the run ends, after the workers have exited, a live process that carries
the id was left behind: it is named, killed (the next run finds its ports free), and the
run fails.

--leak-check=auto (the default) checks runs on xdist workers (the suite's `-n 2`): in a
run without workers the session's own servers (Prefect's, stopped at the interpreter's
exit) are still up when it ends. --leak-check=on checks any run, off none.
"""

from __future__ import annotations

import os
import time
import uuid

import psutil
import pytest

SESSION_VARIABLE = "MULE_TESTS_RUN_ID"
GRACE_S = 5.0  # a process a test stopped may still be finishing its shutdown
_run_id = pytest.StashKey[str]()
_previous = pytest.StashKey[str | None]()


def pytest_addoption(parser):
    parser.addoption("--leak-check", choices=("auto", "on", "off"), default="auto",
                     help="fail the run when processes its tests started are still running at its end (tests/leaks.py)")  # fmt: skip


def _checks(config) -> bool:
    if hasattr(config, "workerinput"):  # an xdist worker: its controller checks, once every worker has exited
        return False
    mode = config.getoption("--leak-check")
    return mode == "on" or (mode == "auto" and bool(getattr(config.option, "numprocesses", None)))


def pytest_configure(config):
    if _checks(config):
        config.stash[_previous] = os.environ.get(SESSION_VARIABLE)
        os.environ[SESSION_VARIABLE] = config.stash[_run_id] = uuid.uuid4().hex


def pytest_unconfigure(config):
    if _run_id in config.stash:  # a run inside a test's process (pytester) gives the test its own id back
        previous = config.stash[_previous]
        if previous is None:
            os.environ.pop(SESSION_VARIABLE, None)
        else:
            os.environ[SESSION_VARIABLE] = previous


def leftovers(run_id: str) -> list:
    """Live processes that carry `run_id`, except this process and its parents."""
    own = {os.getpid(), *(p.pid for p in psutil.Process().parents())}
    found = []
    for process in psutil.process_iter(["pid", "status"]):
        if process.pid in own or process.info["status"] == psutil.STATUS_ZOMBIE:
            continue
        try:
            if process.environ().get(SESSION_VARIABLE) == run_id:
                found.append(process)
        except psutil.Error:  # gone, or another user's
            continue
    return found


def describe(process) -> str:
    try:
        return f"pid {process.pid}: {' '.join(process.cmdline())[:300]}"
    except psutil.Error:
        return f"pid {process.pid}"


@pytest.hookimpl(wrapper=True)
def pytest_sessionfinish(session, exitstatus):
    result = yield  # after pytest-xdist's own: its workers have exited
    run_id = session.config.stash.get(_run_id, None)
    if run_id is None:
        return result
    deadline = time.monotonic() + GRACE_S
    while (found := leftovers(run_id)) and time.monotonic() < deadline:
        time.sleep(0.2)
    if found:
        names = [describe(p) for p in found]
        for process in found:
            try:
                process.kill()
            except psutil.Error:
                pass
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None:
            reporter.ensure_newline()
            reporter.write_sep("=", "processes left running", red=True)
            reporter.write_line(f"{len(names)} process(es) started by the tests were still running at the end (killed now):")
            for name in names:
                reporter.write_line(f"  {name}")
        if session.exitstatus == pytest.ExitCode.OK:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED
    return result
