
"""tests/leaks.py: a process a test leaves running fails the run, and is killed. (The
sessions here run inside this test's process, as pytester runs them, with their own id.)"""

import os

import psutil
import pytest

from tests import leaks

LEAKY = """
import os, subprocess, sys
from pathlib import Path

def test_starts_a_server_and_forgets_it(tmp_path):
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)", str(tmp_path / "store.db")])
    Path(os.environ["LEAKED_PID_FILE"]).write_text(str(sleeper.pid))
"""
TIDY = """
import subprocess, sys

def test_starts_a_process_that_ends_soon(tmp_path):
    subprocess.Popen([sys.executable, "-c", "import time; time.sleep(0.5)", str(tmp_path)])
"""


@pytest.mark.slow
def test_a_process_left_running_is_named_killed_and_fails_the_run(pytester, monkeypatch, tmp_path):
    monkeypatch.setenv("LEAKED_PID_FILE", str(tmp_path / "pid"))
    monkeypatch.setattr(leaks, "GRACE_S", 1.0)  # the session (in this process) waits 1 s, not 5
    pytester.makepyfile(test_leaky=LEAKY)
    result = pytester.runpytest_inprocess("-p", "tests.leaks", "--leak-check=on", "-p", "no:cacheprovider")
    pid = int((tmp_path / "pid").read_text())
    result.stdout.fnmatch_lines(["*processes left running*", "*1 process(es) started by the tests*",
                                 f"*pid {pid}: *time.sleep(120)*store.db*"])  # fmt: skip
    assert result.ret == 1  # the test passed; the session did not
    os.waitpid(pid, 0)  # reaped at once: it was killed, not left to its 120 s
    assert not psutil.pid_exists(pid)


def test_a_process_that_ends_within_the_grace_is_not_a_leak(pytester):
    pytester.makepyfile(test_tidy=TIDY)
    result = pytester.runpytest_inprocess("-p", "tests.leaks", "--leak-check=on", "-p", "no:cacheprovider")
    assert result.ret == 0 and "left running" not in result.stdout.str()


def test_a_run_gives_its_processes_an_id_of_its_own_and_gives_the_last_one_back(pytester):
    before = os.environ.get(leaks.SESSION_VARIABLE)
    pytester.makepyfile(test_id=f"""
import os

def test_sees_an_id_of_its_own():
    assert len(os.environ["MULE_TESTS_RUN_ID"]) == 32 and os.environ["MULE_TESTS_RUN_ID"] != "{before}"
""")
    assert pytester.runpytest_inprocess("-p", "tests.leaks", "--leak-check=on", "-p", "no:cacheprovider").ret == 0
    if before is not None:  # this suite's run (-n 2) has one: it is back
        assert os.environ[leaks.SESSION_VARIABLE] == before
