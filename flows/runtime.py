"""Process environment for Prefect and MLflow; must run before either is imported."""

from __future__ import annotations

import logging
import os
import signal
from collections.abc import Iterator
from contextlib import contextmanager
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


class _NoTracebackForUserErrors(logging.Filter):
    """Prefect logs a failed task or flow run with the exception's traceback; for a user
    error (mule_core.errors) the message is the whole story."""

    def filter(self, record: logging.LogRecord) -> bool:
        from mule.mule_core.errors import is_user_error

        if record.exc_info and record.exc_info[1] is not None and is_user_error(record.exc_info[1]):
            record.exc_info = None
            record.exc_text = None
        return True


class _NoCrashLinesForSignals(logging.Filter):
    """Prefect reports a run stopped by Ctrl-C or SIGTERM as crashed ("Execution was aborted
    by an interrupt signal"), or as failed with whatever the signal's exception became (a
    DuckDB query's "Query interrupted"), sometimes before mule's handler has seen the
    signal: mule's one line (process.interrupts) says it; the flow run's state still does in
    Prefect. A failure logged with its exception waits up to 0.1 s to learn whether a stop
    caused it (only in a command, where the handlers are installed)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if "Execution was aborted by a" in record.getMessage():
            return False
        if record.levelno >= logging.ERROR and record.exc_info:
            from mule.process import interrupts

            return not interrupts.stopping_soon()
        return True


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


class _NoDrainNotices(logging.Filter):
    """At a command's exit Prefect drains its queues of events and logs to the API, and a
    queue with an item still in it says "Still processing items: 1 items remaining..." at
    WARNING, however briefly: printed after mule's last line (its error or its stop), it
    would read as a problem of its own."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("Still processing items")


def quiet_user_errors() -> None:
    """Installs the filters on Prefect's run loggers and its queue services' (idempotent;
    Prefect may reconfigure logging)."""
    for name in ("prefect.task_runs", "prefect.flow_runs", "prefect.flow_engine", "prefect.task_engine",
                 "prefect.engine"):  # fmt: skip
        logger = logging.getLogger(name)
        for kind in (_NoTracebackForUserErrors, _NoCrashLinesForSignals):
            if not any(isinstance(f, kind) for f in logger.filters):
                logger.addFilter(kind())
    for name in ("EventsWorker", "APILogWorker"):  # prefect._internal.concurrency.services: the class's name
        logger = logging.getLogger(name)
        if not any(isinstance(f, _NoDrainNotices) for f in logger.filters):
            logger.addFilter(_NoDrainNotices())


def dask_task_runner(features, shards: int):
    """prefect-dask's runner for the features shards: on the scheduler at
    features.dask_address, else on a LocalCluster with one process per GPU (each shard
    picks its GPU from the worker's number), or two on the CPU, splitting the cores."""
    from prefect_dask import DaskTaskRunner

    if features.dask_address:
        return DaskTaskRunner(address=features.dask_address)
    import torch

    cores = os.cpu_count() or 1
    gpus = torch.cuda.device_count() if features.device in ("auto", "cuda") else 0
    workers = features.dask_workers or gpus or min(2, cores)
    workers = max(1, min(workers, shards))
    threads = str(max(1, cores // workers))
    env = {"OMP_NUM_THREADS": threads, "MKL_NUM_THREADS": threads}  # no oversubscription of the cores
    env |= _prefect_server_for_workers()
    return DaskTaskRunner(cluster_class="distributed.LocalCluster",
                          cluster_kwargs={"n_workers": workers, "threads_per_worker": 1, "processes": True,
                                          "env": env, "dashboard_address": None})  # fmt: skip


def _prefect_server_for_workers() -> dict[str, str]:
    """The API this process talks to, for the Dask workers: a worker without
    PREFECT_API_URL starts an ephemeral server of its own (15-20 s each on 2 cores) and
    reports its task runs where nobody looks."""
    if os.environ.get("PREFECT_API_URL"):
        return {}  # inherited by the workers already
    from prefect.client.orchestration import get_client

    url = str(get_client().api_url or "")
    return {"PREFECT_API_URL": url.rstrip("/")} if url.startswith("http") else {}


class TemporaryPrefectServer:
    """Prefect's ephemeral API server, started before mule imports its stages.

    Left to Prefect, the ephemeral server starts at the first flow call: importing the
    server (~2 s) and then waiting for its process (~5 s) come after mule's own imports
    (~6 s, torch and MLflow), one after the other. Started here, the server process boots
    on one core while the imports run on the other. It is the command Prefect itself runs
    (prefect.server.api.server.SubprocessASGIServer), reached through PREFECT_API_URL, and
    stopped when the process exits."""

    def __init__(self) -> None:
        import importlib.util
        import socket
        import subprocess
        import sys

        # Prefect reads its settings when imported: it must not be imported before
        # PREFECT_API_URL is set below.
        prefect_dir = Path(importlib.util.find_spec("prefect").origin).parent

        with socket.socket() as sock:  # a free port (Prefect picks one at random)
            sock.bind(("127.0.0.1", 0))
            self.port = sock.getsockname()[1]
        env = {**os.environ, "PREFECT_UI_ENABLED": "0", "PREFECT__SERVER_EPHEMERAL": "1", "PREFECT__SERVER_FINAL": "1"}
        # Its own session: a terminal's Ctrl-C goes to mule's process group, and the server
        # must outlive mule's handling of it (the flow runs are reported crashed to it), so
        # mule stops it last (process.interrupts). It dies with mule all the same, even by kill -9.
        self.process = subprocess.Popen(
            [sys.executable, "-m", "uvicorn", "--app-dir", str(prefect_dir.parent), "--factory",
             "prefect.server.api.server:create_app", "--host", "127.0.0.1", "--port", str(self.port),
             "--log-level", "error", "--lifespan", "on"], env=env, start_new_session=True,
            preexec_fn=_die_with_parent)  # fmt: skip
        self.api_url = f"http://127.0.0.1:{self.port}/api"
        os.environ["PREFECT_API_URL"] = self.api_url
        os.environ["MULE_PREFECT_TEMPORARY"] = "1"  # no flow-run links to a server that is gone after the run
        import atexit

        from mule.process import interrupts

        atexit.register(self.stop)
        interrupts.on_stop(lambda: self.stop(drain=False), last=True, abandon=self.process.kill)

    def wait_ready(self, timeout: float | None = None) -> None:
        import time
        import urllib.error
        import urllib.request

        timeout = timeout or float(os.environ.get("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "60"))
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"the temporary Prefect server exited with code {self.process.returncode}")
            try:
                with urllib.request.urlopen(f"{self.api_url}/health", timeout=2) as response:
                    if response.status == 200:
                        return
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"the temporary Prefect server did not answer at {self.api_url} within {timeout:.0f}s")

    def stop(self, drain: bool = True) -> None:
        """`drain`: first let Prefect's log and event workers send what they hold (not when
        a signal stops mule: the flow runs' states are reported already, and every second counts)."""
        if self.process.poll() is None:
            # Prefect's log and event workers send what they hold to this server when the
            # logging module shuts down, which atexit would do after this: do it now,
            # while the server still answers (else each waits for a dead server).
            if drain:
                logging.shutdown()
            self.process.terminate()
            try:
                self.process.wait(timeout=5 if drain else 1)
            except Exception:  # noqa: BLE001 - subprocess.TimeoutExpired: it must go anyway
                self.process.kill()
                self.process.wait()


def _die_with_parent() -> None:
    """In the server's process, before it runs: SIGTERM when mule's process ends (Linux)."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):  # not Linux: the server is stopped at exit as before
        pass


def start_prefect_early() -> TemporaryPrefectServer | None:
    """The temporary server, unless a Prefect server is configured (PREFECT_API_URL), the
    user turned this off (MULE_PREFECT_EARLY_START=0), or Prefect is already imported (mule
    called from Python rather than as a command)."""
    import sys

    if os.environ.get("PREFECT_API_URL") or os.environ.get("MULE_PREFECT_EARLY_START") == "0":
        return None
    if "prefect" in sys.modules:  # its settings are read: it would start its own server regardless
        return None
    return TemporaryPrefectServer()


@contextmanager
def local_flow_settings() -> Iterator[None]:
    """Prefect settings for flows run by this process itself.

    Flow-run heartbeats let a Prefect server mark a run as crashed when its process died.
    With the ephemeral or temporary server, which lives and dies with this process, no one
    listens, and every flow run waits up to a second at its end for the heartbeat thread
    (about 1 s of a stage's 1.2 s of Prefect overhead here). They are off then, and with a
    user's server when MULE_PREFECT_HEARTBEATS=off; deployments run by a worker keep them."""
    own_server = not os.environ.get("PREFECT_API_URL") or os.environ.get("MULE_PREFECT_TEMPORARY")
    if not own_server and os.environ.get("MULE_PREFECT_HEARTBEATS", "").lower() != "off":
        yield
        return
    from prefect.settings import PREFECT_FLOWS_HEARTBEAT_FREQUENCY, temporary_settings

    with temporary_settings(updates={PREFECT_FLOWS_HEARTBEAT_FREQUENCY: None}):
        yield
