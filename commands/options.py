"""What the commands share: the workdir a reading command reads, a server's address."""

from __future__ import annotations

import time

from mule.mule_core.settings import ConfigError
from mule.storage.workdir import Workdir


def reading_workdir(path: str | None, command: str) -> Workdir:
    """The workdir for a reading command (serve, search, catalog, ui): it takes no lock and
    writes nothing there, while a run may be writing it. A workdir copied or moved since its
    last run is read where it is now; the next run points its stored paths here for good."""
    from mule.experiments import mlflow_store

    workdir = Workdir.at(path, create=False)
    if not workdir.root.is_dir():
        raise ConfigError(f"mule {command}: there is no workdir at {workdir.root}: run `mule demo` (or `mule run`) first")
    mlflow_store.check_store(workdir)
    moved = workdir.moved_from()
    if moved is not None:
        print(f"mule {command}: {workdir.root} was copied or moved from {moved}; read where it is now (the next "
              "`mule run` points its stored paths here)", flush=True)  # fmt: skip
    return workdir


def browsable(host: str) -> str:
    return "127.0.0.1" if host in ("0.0.0.0", "::", "") else host


def answers(url: str, process, timeout: float = 120) -> bool:
    import urllib.request

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and process.poll() is None:
        try:
            with urllib.request.urlopen(url, timeout=2):
                return True
        except OSError:
            time.sleep(0.3)
    return False
