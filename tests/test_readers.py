"""A workdir is read while it is written: `mule search`, `mule catalog` and `mule serve`
run in loops while a run rewrites the catalog's tables. The readers take no lock and write
nothing (catalog.duckdb is never replaced under the writer), each of them answers or says
in one line why not, and the run after finds nothing damaged."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading
import urllib.request
from pathlib import Path

import pytest

from tests.conftest import REBUILT_TINY
from tests.test_serving import _wait_for, free_port

REPO = Path(__file__).resolve().parents[1]
WRITES = ["ingest", "text", "features"]


def _mule(*args: str, env: dict, forker=None, log: Path | None = None) -> tuple[int, str]:
    """(exit code, output): `mule ARGS` started as a user starts it, or forked from a
    process that has imported mule (tests/forked.py) when the command imports torch."""
    if forker is not None:
        done = forker.run(list(args), log)
        return done.returncode, done.output()
    done = subprocess.run([sys.executable, "-m", "mule.commands", *args], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=600)  # fmt: skip
    return done.returncode, done.stdout + done.stderr


@pytest.mark.slow
def test_readers_never_break_a_run_that_writes_and_never_write(rebuilt_as_built, tmp_path, prefect_api_url, forker):
    from mule.experiments.relocation import adopt
    from mule.storage.workdir import Workdir

    shutil.copytree(rebuilt_as_built[0].root, tmp_path / "work")
    wd = Workdir.at(tmp_path / "work")
    adopt(wd)
    root = str(wd.root)
    sets = [a for k, v in REBUILT_TINY.items() for a in ("--set", f"{k}={v}")]
    env = {**os.environ, "PREFECT_API_URL": prefect_api_url, "MULE_PREFECT_HEARTBEATS": "off"}
    catalog_inode = wd.duckdb_path.stat().st_ino
    port = free_port()
    server = subprocess.Popen([sys.executable, "-m", "mule.commands", "serve", "--workdir", root, "--port", str(port),
                               "--reload", "1"], cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True)  # fmt: skip
    answers: list[tuple[str, int, str]] = []
    writing = threading.Event()

    def read_in_a_loop() -> None:
        while writing.is_set():
            for args in (("catalog",), ("search", "a red circle", "--k", "1")):
                log = tmp_path / f"{args[0]}-{len(answers)}.log"
                code, output = _mule(*args, "--workdir", root, env=env, forker=forker if args[0] == "search" else None,
                                     log=log)  # fmt: skip
                answers.append((args[0], code, output))
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/search?q=a+red+circle&k=1", timeout=30) as r:
                answers.append(("serve", 0 if r.status == 200 else r.status, ""))

    try:
        _wait_for(f"http://127.0.0.1:{port}/api/info", server, 120)
        writing.set()
        reader = threading.Thread(target=read_in_a_loop)
        reader.start()
        runs = []
        for _ in range(1):  # rewrite the tables, the word vectors and the features
            runs.append(_mule("run", *WRITES, "--workdir", root, *sets, *[a for s in WRITES for a in ("--force", s)],
                              env=env, forker=forker, log=tmp_path / "writer.log"))  # fmt: skip
        writing.clear()
        reader.join(timeout=300)
    finally:
        writing.clear()
        server.terminate()
        served = server.communicate(timeout=30)[0]
    for code, output in runs:
        assert code == 0, output[-3000:]
        assert "unreadable; rebuilt" not in output
    assert len(answers) >= 3, answers
    for kind, code, output in answers:
        assert "Traceback" not in output, (kind, output[-3000:])
        if code != 0:  # a reader that cannot read says so in one line
            lines = [line for line in output.splitlines() if line.strip()]
            assert len(lines) == 1 and "writing the catalog" in lines[0], (kind, output[-2000:])
    assert any(kind == "search" and code == 0 for kind, code, _ in answers)
    assert wd.duckdb_path.stat().st_ino == catalog_inode  # never replaced under the writer
    assert "Traceback" not in served and "now serving" in served  # it picked the new gallery up
    code, output = _mule("run", *WRITES, "--workdir", root, *sets, env=env)
    assert code == 0 and "runs again first" not in output
    assert "every stage is up to date" in output
