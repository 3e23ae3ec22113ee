"""`mule ui`: MLflow's UI on the workdir's store, opened at the runs."""

from __future__ import annotations

import argparse
import os
import sys

from mule.commands.options import answers, browsable, reading_workdir
from mule.mule_core.settings import ConfigError


def run(args: argparse.Namespace) -> int:
    """MLflow's UI on the workdir's store; prints (and with --open, opens) the address of the
    dataset's runs: the experiment's runs table in the model-training view, which MLflow 3
    takes from the address (workflowType), not from the experiment's tag."""
    if args.workers < 1:
        raise ConfigError(f"--workers must be at least 1, got {args.workers}")
    from mule.experiments import mlflow_store, tracking

    workdir = reading_workdir(args.workdir, "ui")
    if not mlflow_store.store_exists(workdir):
        print(f"no runs yet in {workdir.root}: run `mule demo` first", flush=True)
        return 1
    base = f"http://{browsable(args.host)}:{args.port}"
    runs = tracking.runs_address(workdir, base, args.dataset)
    command = [sys.executable, "-m", "mlflow", "ui", "--backend-store-uri", workdir.mlflow_uri,
               "--default-artifact-root", workdir.artifacts_dir.as_uri(), "--host", args.host, "--port", str(args.port),
               "--workers", str(args.workers)]  # fmt: skip
    print(f"MLflow UI for {workdir.root} at {base}", flush=True)
    print(f"runs: {runs}" if runs else "no runs yet: run `mule demo` first", flush=True)
    import signal
    import subprocess
    import webbrowser

    from mule.stopping import interrupts

    _record_what_waits(workdir)

    # Its own session, so that this process alone decides when it stops (MLflow's server
    # starts workers of its own): Ctrl-C and SIGTERM stop the whole group, and free the port.
    # Without MLflow 3's job runner (GenAI scorers and prompt jobs, which mule never submits):
    # it starts eight more Python processes, 1.9 GB and 18 CPU-seconds (bench/ui_startup.py).
    env = {"MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false", **os.environ}
    server = subprocess.Popen(command, start_new_session=True, env=env)
    interrupts.on_stop(lambda: _stop_group(server), abandon=lambda: _kill_group(server, signal.SIGKILL))
    interrupts.install(lambda signum: f"mule ui: stopped by {interrupts.how(signum)}; port {args.port} is free")
    if args.open and answers(f"{base}/health", server):
        webbrowser.open(runs or base)
    return server.wait()


RECORD_EVERY_S = 3.0


def _record_what_waits(workdir) -> None:
    """The runs no-change rebuilds left to record (pipeline.deferred), written into MLflow now
    and every few seconds while the UI serves, so that a rebuild shows in the UI a few
    seconds after it returned; never waiting for a run that holds the workdir (it records
    them itself)."""
    import threading
    import time

    from mule.pipeline import deferred

    def record() -> None:
        if deferred.waiting(workdir):
            deferred.record_unrecorded(workdir, patience=0)

    def recorded() -> bool:
        try:
            record()
            return True
        except Exception as error:  # noqa: BLE001 - the UI serves on (a read-only workdir); the next run records them
            print(f"mule ui: what rebuilds left to record waits for the next run ({error})", flush=True)
            return False

    def watch() -> None:
        while True:
            time.sleep(RECORD_EVERY_S)
            if not recorded():
                return

    if recorded():
        threading.Thread(target=watch, name="mule-ui-recorder", daemon=True).start()


def _kill_group(process, signum) -> None:
    import contextlib

    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signum)


def _stop_group(process, grace: float = 1.0) -> None:
    """SIGTERM to a server's process group, SIGKILL if it is still there after `grace` seconds."""
    import signal
    import subprocess

    _kill_group(process, signal.SIGTERM)
    try:
        process.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        _kill_group(process, signal.SIGKILL)
        process.wait()
