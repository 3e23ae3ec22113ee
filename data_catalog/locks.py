"""One mule process at a time per workdir.

Two `mule run` (or deployment) processes writing the same catalog could interleave their
tables; the second one refuses with a message naming the holder instead. The lock is an
flock on <workdir>/mule.lock, so the kernel releases it when its holder dies, even by
kill -9: a stale lock never blocks the rerun. The file holds who has it (pid, host,
stage, command, since when) for the refusal message. A process re-enters its own lock:
`rebuild` holds it across its stages and each stage updates the holder's stage.
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager

from mule_core.errors import UserError

from .workdir import Workdir

_held: dict[str, int] = {}  # lock file -> descriptor, for the locks this process holds


class WorkdirBusyError(UserError):
    pass


def _describe(info: dict) -> str:
    since = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(info.get("since", 0)))
    return (f"pid {info.get('pid')} on {info.get('host')}, stage {info.get('stage')!r} of "
            f"`{info.get('command')}`, since {since}")  # fmt: skip


def _write_holder(fd: int, stage: str, since: float) -> None:
    info = {"pid": os.getpid(), "host": socket.gethostname(), "stage": stage,
            "command": " ".join(os.path.basename(a) if i == 0 else a for i, a in enumerate(sys.argv)), "since": since}  # fmt: skip
    data = json.dumps(info).encode()
    os.ftruncate(fd, 0)
    os.pwrite(fd, data, 0)


def holder(workdir: Workdir) -> dict | None:
    """Who holds the workdir's lock, as its file says (None when free or unreadable)."""
    try:
        return json.loads(workdir.lock_path.read_text() or "null")
    except (FileNotFoundError, ValueError):
        return None


def holds_lock(workdir: Workdir) -> bool:
    """This process holds the workdir's lock already (a stage run by rebuild)."""
    return str(workdir.lock_path) in _held


@contextmanager
def workdir_lock(workdir: Workdir, stage: str) -> Iterator[None]:
    path = str(workdir.lock_path)
    if path in _held:  # this process already holds it (a stage inside rebuild)
        _write_holder(_held[path], stage, time.time())
        yield
        return
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        info = holder(workdir) or {}
        raise WorkdirBusyError(
            f"the workdir {workdir.root} is in use by another mule process ({_describe(info)}): wait for it to "
            "finish, or stop it, then run this again"
        ) from None
    _held[path] = fd
    try:
        _write_holder(fd, stage, time.time())
        yield
    finally:
        del _held[path]
        os.ftruncate(fd, 0)
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)
