"""`mule` commands in processes forked from one that has imported mule already.

Each child runs the command's own entry point (commands/main.py: entry, or a script that
ends in it) in a session of its own, with its output in a file, exactly as `python -m
mule.commands ...` would run it, but without paying the ~5 s of imports (torch, Prefect,
MLflow, the stages' libraries) each time: the suite starts dozens of commands.

The forking process reads Prefect's settings when it imports Prefect, so its children
talk to the server it was started with (the session's: the `prefect_api_url` fixture);
tests of a user's own first run, with its temporary server, start `mule` as a user does.

    forker = Forker(env)                       # once (a session fixture: `forker`)
    child = forker.start(args, log, env={...}) # -> Forked: .pid, .poll(), .wait(), .output()
    done = forker.run(args, log)               # started and waited for: .returncode, .output()
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

# What the forking process imports once for all its children: the command, then what a
# tiny `mule demo` imports as it runs (the stages and their libraries, MLflow's model
# logging, the plots: a forked demo 9.4 s -> 7.5 s; 6.6 s is what a demo costs with
# nothing left to import). None starts a thread on import.
PRELOAD = r"""
import importlib
import mule.commands.main, mule.flows.stages  # noqa: F401 - the imports every child shares
for name in ("torch", "torchvision", "timm", "onnxruntime", "fasttext", "duckdb", "faiss", "sacremoses",
             "mule.tasks.ingest", "mule.tasks.translate", "mule.tasks.features", "mule.tasks.text",
             "mule.tasks.pretrain", "mule.tasks.train", "mule.tasks.evaluate", "mule.tasks.index",
             "mule.serving.mlflow_model", "mule.generators.scenes", "mule.storage.store_templates",
             "mule.pipeline.deferred", "mule.experiments.relocation", "mlflow.pyfunc", "mlflow.models",
             "mlflow.store.tracking.sqlalchemy_store", "alembic.command", "prefect.flow_engine", "prefect.task_engine",
             "prefect.artifacts", "matplotlib.pyplot", "pandas", "pyarrow.dataset", "git", "graphviz", "langcodes"):
    try:
        importlib.import_module(name)
    except ImportError:
        pass
try:  # the installed packages' module map MLflow checks a logged model's requirements with
    from mlflow.utils.requirements_utils import _init_packages_to_modules_map

    from mule.experiments.tracking import mlflow_knows_installed_packages

    mlflow_knows_installed_packages()  # from mule's cache, as `mule` gives it (not 1.9 s of RECORD files)
    _init_packages_to_modules_map()
except ImportError:
    pass
import PIL.Image

PIL.Image.init()  # the image plugins PIL loads on its first open
import gc

# Out of the collector's sight: a child's first full collection would otherwise walk (and
# write to, copying every page on write) all the objects imported above. A forked tiny
# demo: 7.25 -> 6.4 CPU-s, 8.1 -> 5.3 s.
gc.freeze()
"""

# No threads in this process: a fork copies only the forking thread, and any lock another
# thread held would stay held in the child.
SERVER = PRELOAD + r"""
import json, os, select, signal, sys, traceback
out = os.fdopen(os.dup(1), "w", buffering=1)  # the answers: not the children's fd 1


def child(request):
    os.setsid()
    os.chdir(request.get("cwd") or os.getcwd())
    os.environ.update(request.get("env") or {})
    for name in request.get("unset") or ():
        os.environ.pop(name, None)
    fd = os.open(request["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    if request.get("errors"):  # stderr in a file of its own
        fd = os.open(request["errors"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(fd, 2)
        os.close(fd)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    sys.argv = ["mule", *request["args"]]
    code = 1
    try:
        if request.get("script"):
            exec(compile(request["script"], "<script>", "exec"), {"__name__": "__main__"})
        else:
            mule.commands.main.entry()
        code = 0
    except SystemExit as stop:
        code = stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 1)
    except BaseException:
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


pending = b""
running = set()
while True:
    ready, _, _ = select.select([0], [], [], 0.02)
    if ready:
        chunk = os.read(0, 1 << 16)
        if not chunk:
            break
        pending += chunk
        while b"\n" in pending:
            line, pending = pending.split(b"\n", 1)
            request = json.loads(line)
            pid = os.fork()
            if pid == 0:
                child(request)
            running.add(pid)
            out.write(json.dumps({"id": request["id"], "pid": pid}) + "\n")
    while running:
        pid, status = os.waitpid(-1, os.WNOHANG)
        if pid == 0:
            break
        running.discard(pid)
        try:
            os.killpg(pid, signal.SIGKILL)  # whatever the child left running in its session
        except (ProcessLookupError, PermissionError):
            pass
        out.write(json.dumps({"ended": pid, "code": os.waitstatus_to_exitcode(status)}) + "\n")
for pid in running:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
"""


class Forked:
    """A child of the forking process, as much like subprocess.Popen as the tests need."""

    def __init__(self, forker: Forker, pid: int, log: Path, errors: Path | None = None):
        self.forker, self.pid, self.log, self.errors = forker, pid, log, errors

    @property
    def returncode(self) -> int | None:
        return self.forker.ended.get(self.pid)

    def poll(self) -> int | None:
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        with self.forker.changed:
            if not self.forker.changed.wait_for(lambda: self.pid in self.forker.ended or self.forker.dead, timeout):
                raise subprocess.TimeoutExpired(f"mule (forked, pid {self.pid})", timeout)
        assert self.pid in self.forker.ended, f"the forking process died: {self.forker.process.poll()}"
        return self.forker.ended[self.pid]

    def output(self) -> str:
        """What it printed (stdout, and stderr unless it went to `errors`)."""
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def stderr(self) -> str:
        """What it printed on stderr, when started with `errors`."""
        assert self.errors is not None, "started without a stderr file of its own"
        return self.errors.read_text(errors="replace") if self.errors.exists() else ""


class Forker:
    def __init__(self, env: dict[str, str]):
        self.process = subprocess.Popen([sys.executable, "-c", SERVER], env=env, cwd=REPO, stdin=subprocess.PIPE,
                                        stdout=subprocess.PIPE, text=True)  # fmt: skip
        self.started: dict[int, int] = {}
        self.ended: dict[int, int] = {}
        self.dead = False
        self.changed = threading.Condition()
        self.lock = threading.Lock()
        self.next_id = 0
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.process.stdout:
            message = json.loads(line)
            with self.changed:
                if "ended" in message:
                    self.ended[message["ended"]] = message["code"]
                else:
                    self.started[message["id"]] = message["pid"]
                self.changed.notify_all()
        with self.changed:
            self.dead = True
            self.changed.notify_all()

    def start(self, args: list[str], log: Path, env: dict[str, str] | None = None, unset: tuple[str, ...] = (),
              script: str | None = None, cwd: Path | None = None, errors: Path | None = None) -> Forked:  # fmt: skip
        """`mule ARGS` (or a script that ends in the entry point, sys.argv as the command's),
        its output in `log`, its stderr there too or, with `errors`, in that file."""
        with self.lock:
            self.next_id += 1
            request_id = self.next_id
            request = {"id": request_id, "args": list(args), "log": str(log), "env": env or {}, "unset": list(unset),
                       "script": script, "cwd": str(cwd or REPO), "errors": str(errors) if errors else None}  # fmt: skip
            self.process.stdin.write(json.dumps(request) + "\n")
            self.process.stdin.flush()
        with self.changed:
            assert self.changed.wait_for(lambda: request_id in self.started or self.dead, 120), "no fork in 120 s"
            assert not self.dead, f"the forking process died: {self.process.poll()}"
            return Forked(self, self.started[request_id], log, errors)

    def run(self, args: list[str], log: Path, timeout: float = 600, **options) -> Forked:
        child = self.start(args, log, **options)
        child.wait(timeout)
        return child

    def close(self) -> None:
        self.process.stdin.close()
        deadline = time.monotonic() + 30
        while self.process.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        if self.process.poll() is None:
            self.process.kill()
