"""The temporary Prefect server a run starts early (beside mule's own imports) and stops
with the run, and the settings flows run under locally."""

from __future__ import annotations

import logging
import os
import signal
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


def prefect_server_for_workers() -> dict[str, str]:
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
        # mule stops it last (stopping.interrupts). It dies with mule all the same, even by kill -9.
        self.process = subprocess.Popen(
            [sys.executable, "-m", "uvicorn", "--app-dir", str(prefect_dir.parent), "--factory",
             "prefect.server.api.server:create_app", "--host", "127.0.0.1", "--port", str(self.port),
             "--log-level", "error", "--lifespan", "on"], env=env, start_new_session=True,
            preexec_fn=_die_with_parent)  # fmt: skip
        self.api_url = f"http://127.0.0.1:{self.port}/api"
        os.environ["PREFECT_API_URL"] = self.api_url
        os.environ["MULE_PREFECT_TEMPORARY"] = "1"  # no flow-run links to a server that is gone after the run
        import atexit

        from mule.stopping import interrupts

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
