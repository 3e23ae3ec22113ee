"""What a command shows a person, and where everything else goes.

The console (stderr) gets mule's lines meant for people (a record logged with
`extra=SHOWN`: a stage's decision and time, a progress line with its rate and ETA, a
stage's one-line result), every warning once, and the command's own printed results.
Everything (Prefect's flow and task lines, MLflow's, each epoch's losses, the stage
details) goes to the run's log file, `<workdir>/logs/<time>-<command>.log`. `-v` shows it
all on the console as well.

The handlers sit on the root logger before Prefect or MLflow configure logging: Prefect
then leaves the root logger alone (its loggers propagate here), and MLflow is told not to
configure its own (MLFLOW_CONFIGURE_LOGGING) nor to draw download bars in an offline run.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from pathlib import Path

from mule.mule_core.progress import SHOWN

__all__ = ["SHOWN", "setup", "teardown", "run_log_path"]

KEPT_LOGS = 50  # the newest run logs kept in a workdir
QUIET_LIBRARIES = ("prefect", "EventsWorker", "APILogWorker", "uvicorn", "httpx", "httpcore", "alembic",
                   "distributed", "asyncio", "mlflow", "urllib3", "filelock", "matplotlib", "PIL")  # fmt: skip


class ForPeople(logging.Filter):
    """Passes what a person reads on the console: mule's records marked SHOWN, and each
    distinct warning or error once (but Prefect's and its server's: the run's log has
    them, and mule's own error line says what failed)."""

    def __init__(self, verbose: bool = False):
        super().__init__()
        self.verbose = verbose
        self.seen: set[tuple[str, str]] = set()

    def filter(self, record: logging.LogRecord) -> bool:
        if self.verbose:
            return True
        library = record.name.split(".")[0] in QUIET_LIBRARIES and record.name != "py.warnings"
        if record.levelno >= logging.WARNING:
            if library and record.levelno < logging.CRITICAL:
                return False
            key = (record.name, record.getMessage())
            if key in self.seen:
                return False
            self.seen.add(key)
            return True
        return record.name.startswith("mule") and bool(getattr(record, "console", False))


class ConsoleFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        clock = time.strftime("%H:%M:%S", time.localtime(record.created))
        message = record.getMessage()
        if record.levelno >= logging.WARNING:
            message = f"{record.levelname.lower()}: {message}"
        if record.exc_info and not getattr(record, "console", False):
            message += "\n" + self.formatException(record.exc_info)
        return f"{clock} {message}"


class ConsoleHandler(logging.StreamHandler):
    """stderr as it is when a line is written (a test's capture, a redirected stream)."""

    def emit(self, record: logging.LogRecord) -> None:
        self.stream = sys.stderr
        super().emit(record)


def teardown() -> None:
    """Takes the console's and the log file's handlers off (a command run in-process, as the tests do)."""
    root = logging.getLogger()
    for handler in [h for h in root.handlers if getattr(h, "mule_console", False)]:
        root.removeHandler(handler)
        handler.close()


def run_log_path(workdir: Path, command: str) -> Path:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    return Path(workdir) / "logs" / f"{stamp}-{os.getpid()}-{command}.log"


def setup(command: str, workdir: Path | None, verbose: bool = False) -> Path | None:
    """The console and the run's log file (None without a workdir to keep it in)."""
    os.environ.setdefault("MLFLOW_CONFIGURE_LOGGING", "false")
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    teardown()  # a second command in one process (the tests): its own handlers
    root = logging.getLogger()
    for handler in [h for h in root.handlers if type(h).__name__ == "PrefectConsoleHandler"]:
        root.removeHandler(handler)  # Prefect set logging up first (imported before the command): ours instead
    console = ConsoleHandler(sys.stderr)
    console.setFormatter(ConsoleFormatter())
    console.addFilter(ForPeople(verbose))
    console.mule_console = True
    root.addHandler(console)
    root.setLevel(logging.INFO)
    logging.getLogger("mule").setLevel(logging.INFO)
    logging.captureWarnings(True)  # Python's warnings through logging: once on the console, all in the file
    path = None
    if workdir is not None and Path(workdir).is_dir():
        path = run_log_path(Path(workdir), command)
        try:  # opened now, not at the first line: a workdir that cannot take it is known here
            path.parent.mkdir(exist_ok=True)
            _prune(path.parent)
            file = logging.FileHandler(path, encoding="utf-8")
        except OSError as error:  # a workdir that cannot take a log (read-only: a shared model folder) still runs
            logging.getLogger("mule.console").warning(
                "%s cannot be written (%s): nothing is logged there", Path(workdir),
                error.strerror or type(error).__name__)  # fmt: skip
            return None
        file.setFormatter(logging.Formatter("%(asctime)s.%(msecs)03d | %(levelname)-7s | %(name)s - %(message)s",
                                            "%H:%M:%S"))  # fmt: skip
        file.mule_console = True
        root.addHandler(file)
    mlflow = logging.getLogger("mlflow")  # MLflow imported first configured its own console: to the root's instead
    for handler in [h for h in mlflow.handlers if type(h) is logging.StreamHandler]:
        mlflow.removeHandler(handler)
    mlflow.propagate = True
    for chatty in ("httpx", "httpcore"):  # a line per request to Prefect's server: not even for the file
        logging.getLogger(chatty).setLevel(logging.WARNING)
    return path


def _prune(folder: Path) -> None:
    logs = sorted(folder.glob("*.log"), key=lambda p: p.stat().st_mtime)
    for old in logs[: max(0, len(logs) - KEPT_LOGS + 1)]:
        old.unlink(missing_ok=True)
