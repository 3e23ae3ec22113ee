"""The process's environment for Prefect and MLflow, set before either is imported (Prefect
reads its settings when imported): Prefect's home in the workdir, its database checked and
seeded from a template, no telemetry; and the process's niceness (MULE_NICE)."""

from __future__ import annotations

import logging
import os
from pathlib import Path

from mule.mule_core.errors import UserError


def prepare_environment(workdir: Path) -> None:
    """Ephemeral Prefect (no server) with its home in the workdir, unless the user has
    pointed Prefect elsewhere; mule's own loggers in Prefect's run logs; no telemetry."""
    if not os.environ.get("PREFECT_API_URL"):
        os.environ.setdefault("PREFECT_HOME", str(workdir / "prefect"))
    os.environ.setdefault("PREFECT_LOGGING_EXTRA_LOGGERS", "mule")
    os.environ.setdefault("PREFECT_LOGGING_TO_API_WHEN_MISSING_FLOW", "ignore")  # mule_core used outside a flow
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "60")
    os.environ.setdefault("DO_NOT_TRACK", "true")
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    os.environ.setdefault("GIT_PYTHON_REFRESH", "quiet")
    # Prefect attaches its handlers to the "mule" loggers; they must pass INFO through.
    logging.getLogger("mule").setLevel(logging.INFO)


class PrefectDatabaseError(UserError):
    pass


def check_prefect_database() -> None:
    """The workdir's Prefect database (the temporary server's) must read, else the server
    dies at start with a traceback that does not say why."""
    if os.environ.get("PREFECT_API_URL") or not os.environ.get("PREFECT_HOME"):
        return  # the user's server, or Prefect's own home: not ours to judge
    from mule.storage.workdir import sqlite_problem

    home = Path(os.environ["PREFECT_HOME"])
    problem = sqlite_problem(home / "prefect.db")
    if problem:
        raise PrefectDatabaseError(
            f"the Prefect database {home / 'prefect.db'} cannot be read ({problem}). It holds only the history "
            f"of this workdir's flow runs: delete the folder {home} (rm -r {home}) and run again"
        )


def seed_prefect_home() -> bool:
    """The workdir's Prefect database, when it has none yet, copied from the template for
    this Prefect version (storage/store_templates.py): the temporary server then
    starts without migrating a database from nothing (about 4 s on 2 cores)."""
    database_settings = ("PREFECT_API_DATABASE_", "PREFECT_SERVER_DATABASE_")
    if os.environ.get("PREFECT_API_URL") or not os.environ.get("PREFECT_HOME") or \
            any(k.startswith(database_settings) for k in os.environ):  # fmt: skip
        return False  # the user's server or database, or Prefect's own home: not ours to make
    from importlib.metadata import version

    from mule.storage.store_templates import copy_database, from_template

    def make(path: Path) -> None:
        import shutil
        import subprocess
        import sys
        import tempfile

        home = Path(tempfile.mkdtemp(prefix="mule-prefect-template-"))
        try:
            env = dict(os.environ)
            code = ("import asyncio\nfrom prefect.server.database import provide_database_interface\n"
                    "asyncio.run(provide_database_interface().create_db())")  # fmt: skip
            subprocess.run([sys.executable, "-c", code], env=env | {"PREFECT_HOME": str(home)}, check=True,
                           capture_output=True, timeout=600)  # fmt: skip
            copy_database(home / "prefect.db", path)
        finally:
            shutil.rmtree(home, ignore_errors=True)

    return from_template(Path(os.environ["PREFECT_HOME"]) / "prefect.db", f"prefect-{version('prefect')}", make)


def yield_to_serving() -> int:
    """MULE_NICE=N (the scheduled deployments set 10: prefect.yaml) runs this process's
    work N steps nicer, so that `mule serve` on the same machine answers as if alone while
    a rebuild trains (bench/serve_beside_rebuild.py: 20 searches a second, median 15.8 ms
    beside a rebuild at the same priority, 5.9 ms beside one at 10, 5.7 ms alone; the
    rebuild 1.39x and 1.52x its time alone). A niceness only ever grows (lowering it needs
    privileges). On Linux it belongs to a thread: set in the thread that computes, before
    it starts the threads and processes that compute with it (torch's, ONNX Runtime's,
    fastText's, Dask's), which inherit it. Returns the thread's niceness now."""
    value = os.environ.get("MULE_NICE", "").strip()
    if not hasattr(os, "getpriority"):  # not a POSIX system: nothing to set
        return 0
    if value:
        from mule.mule_core.settings import ConfigError

        wanted = int(value) if value.lstrip("-").isdigit() else None
        if wanted is None or not 0 <= wanted <= 19:
            raise ConfigError(f"MULE_NICE must be a niceness from 0 to 19, got {value if wanted is not None else repr(value)}")
        if wanted > os.getpriority(os.PRIO_PROCESS, 0):
            os.setpriority(os.PRIO_PROCESS, 0, wanted)
    return os.getpriority(os.PRIO_PROCESS, 0)
