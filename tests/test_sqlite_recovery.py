"""A writer of MLflow's (or Prefect's) SQLite store killed mid-transaction leaves a hot
journal; the next run's check of the store must let SQLite roll it back, not call the
store damaged (a crash test once ended there: "attempt to write a readonly database")."""

import os
import signal
import sqlite3
import subprocess
import sys

from mule.storage.workdir import sqlite_problem

KILLED_MID_TRANSACTION = """
import os, signal, sqlite3, sys
con = sqlite3.connect(sys.argv[1], isolation_level=None)
con.execute("PRAGMA cache_size=1")  # the transaction's pages spill to the file: the journal is hot
con.execute("BEGIN")
con.executemany("INSERT INTO runs VALUES (?)", [("x" * 500,) for _ in range(2000)])
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_a_store_whose_writer_was_killed_mid_transaction_is_not_damaged(tmp_path):
    store = tmp_path / "mlflow.db"
    with sqlite3.connect(store) as con:
        con.execute("CREATE TABLE runs (name TEXT)")
        con.execute("INSERT INTO runs VALUES ('kept')")
    killed = subprocess.run([sys.executable, "-c", KILLED_MID_TRANSACTION, str(store)], timeout=60)
    assert killed.returncode == -signal.SIGKILL
    assert os.path.exists(f"{store}-journal")  # hot: a read-only connection cannot roll it back
    assert sqlite_problem(store) is None
    with sqlite3.connect(store) as con:
        assert con.execute("SELECT name FROM runs").fetchall() == [("kept",)]  # the killed transaction rolled back


def test_a_store_that_is_not_sqlite_is_damaged(tmp_path):
    store = tmp_path / "mlflow.db"
    store.write_bytes(b"not a database" * 100)
    assert "not a database" in sqlite_problem(store)
