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
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from mule.mule_core.errors import UserError

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
def workdir_lock(workdir: Workdir, stage: str, wait: bool = False,
                 waiting: Callable[[dict], None] | None = None) -> Iterator[None]:  # fmt: skip
    """The workdir for this process alone. Held already (a stage inside the rebuild): the
    holder's stage is updated, and put back when the stage ends (not when it fails: the
    stage a run stopped in is what `last_stage` tells). Held by another process: refused,
    or with `wait` waited for, `waiting(holder)` told each time the holder's stage changes."""
    global _last_stage
    path = str(workdir.lock_path)
    if path in _held:  # this process already holds it (a stage inside rebuild)
        fd, outer = _held[path], _last_stage
        _write_holder(fd, stage, time.time())
        _last_stage = stage
        yield
        _write_holder(fd, outer or stage, time.time())
        _last_stage = outer
        return
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    told = None
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            break
        except BlockingIOError:
            info = holder(workdir) or {}
            if not wait:
                os.close(fd)
                raise WorkdirBusyError(
                    f"the workdir {workdir.root} is in use by another mule process ({_describe(info)}): wait for "
                    "it to finish (or run with --wait), or stop it, then run this again"
                ) from None
            if waiting and info and info.get("stage") != told:
                waiting(info)
                told = info.get("stage")
            time.sleep(0.2)
    _held[path] = fd
    try:
        _write_holder(fd, stage, time.time())
        _last_stage = stage
        yield
    finally:
        del _held[path]
        os.ftruncate(fd, 0)
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


_last_stage: str | None = None


def last_stage() -> str | None:
    """The stage this process's lock named last: the one in hand, or the one a run stopped in."""
    return _last_stage


def describe(info: dict) -> str:
    return _describe(info)
