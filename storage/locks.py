"""One mule process at a time per workdir, and readers that never see a stage half-written.

Two `mule run` (or deployment) processes writing the same catalog could interleave their
tables; the second one refuses with a message naming the holder instead. The lock is an
flock on <workdir>/mule.lock, so the kernel releases it when its holder dies, even by
kill -9: a stale lock never blocks the rerun. The file holds who has it (pid, host,
stage, command, since when) for the refusal message. A process re-enters its own lock:
`rebuild` holds it across its stages and each stage updates the holder's stage.

Readers (`mule serve`, `mule search`, `mule catalog`) take no workdir lock: they read while
a run writes. What they read is consistent: a stage that changes what readers see
(Catalog's writes of tables, of the current features, of the gallery index) first takes
catalog.lock exclusively (`committing`), and keeps it until its record is written
(`end_commit`, by pipeline.runner), so its outputs appear all at once; a reader loads
under the shared lock (`catalog_reading`), waiting the few seconds a stage takes to write
them. A stage's computing (training for an hour) holds nothing readers wait for.
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from mule.mule_core.errors import UserError
from mule.storage.atomic import write_json_atomic
from mule.storage.workdir import Workdir

BRIEF_S = 60.0  # how long a brief holder is waited for
_held: dict[str, int] = {}  # lock file -> descriptor, for the locks this process holds
_runs: dict[str, str] = {}  # lock file -> this holding's token (what a remote worker checks)


class WorkdirBusyError(UserError):
    pass


def _describe(info: dict) -> str:
    since = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(info.get("since", 0)))
    return (f"pid {info.get('pid')} on {info.get('host')}, stage {info.get('stage')!r} of "
            f"`{info.get('command')}`, since {since}")  # fmt: skip


def _write_holder(fd: int, stage: str, since: float, run: str = "", brief: bool = False) -> None:
    info = {"pid": os.getpid(), "host": socket.gethostname(), "stage": stage, "run": run, "brief": brief,
            "command": _command_line(), "since": since}  # fmt: skip
    data = json.dumps(info).encode()
    os.ftruncate(fd, 0)
    os.pwrite(fd, data, 0)


def holder(workdir: Workdir) -> dict | None:
    """Who holds the workdir's lock, as its file says (None when free or unreadable)."""
    try:
        return json.loads(workdir.lock_path.read_text() or "null")
    except (FileNotFoundError, ValueError):
        return None


def run_token(workdir: Workdir) -> str | None:
    """This process's holding of the workdir's lock, as a token (None when it holds none):
    what work handed to other machines checks before it writes (still_running)."""
    return _runs.get(str(workdir.lock_path))


def still_running(workdir: Workdir, token: str) -> bool:
    """The run whose token this is still holds the workdir: a Dask worker's shard, done
    after that run stopped (its lock released) or while another run holds the workdir, is
    not written. Asked from any process that sees the workdir."""
    if _runs.get(str(workdir.lock_path)) == token:
        return True
    try:
        fd = os.open(workdir.lock_path, os.O_RDONLY)
    except FileNotFoundError:
        return False
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            return False  # nobody holds it: the run is over
        except BlockingIOError:
            return (holder(workdir) or {}).get("run") == token
    finally:
        os.close(fd)


def holds_lock(workdir: Workdir) -> bool:
    """This process holds the workdir's lock already (a stage run by rebuild)."""
    return str(workdir.lock_path) in _held


@contextmanager
def workdir_lock(workdir: Workdir, stage: str, wait: bool = False,
                 waiting: Callable[[dict], None] | None = None, patience: float = 0.0,
                 brief: bool = False) -> Iterator[None]:  # fmt: skip
    """The workdir for this process alone. Held already (a stage inside the rebuild): the
    holder's stage is updated, and put back when the stage ends (not when it fails: the
    stage a run stopped in is what `last_stage` tells). Held by another process: refused
    (after `patience` seconds of trying), or with `wait` waited for, `waiting(holder)` told
    each time the holder's stage changes. A `brief` holder (the recorder of deferred MLflow
    runs: seconds) is waited for, up to BRIEF_S."""
    global _last_stage
    path = str(workdir.lock_path)
    if path in _held:  # this process already holds it (a stage inside the rebuild, a step inside a sweep)
        fd, outer = _held[path], _outer.get(path)
        _in_hand.append(stage)
        _write_holder(fd, " + ".join(_in_hand), time.time(), _runs[path])
        _last_stage = stage
        yield
        _in_hand.remove(stage)
        _write_holder(fd, " + ".join(_in_hand) or outer or stage, time.time(), _runs[path])
        _last_stage = _in_hand[-1] if _in_hand else outer
        return
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    told, started, unsaid = None, time.monotonic(), None
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            break
        except BlockingIOError:
            info = holder(workdir) or {}
            now = time.monotonic()
            # a brief holder is waited for a minute at most (a recorder that hangs is refused);
            # one that has not said who it is yet, or has just let go (its file emptied before
            # its lock: a brief holder ending after a second of waiting), a second from then
            unsaid = (unsaid or now) if not info else None
            if info.get("brief"):
                late = now - started >= max(patience, BRIEF_S)
            elif not info:
                late = now - started >= patience and now - unsaid >= 1.0
            else:
                late = now - started >= patience
            if not wait and late:
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
    _runs[path] = uuid.uuid4().hex
    _outer[path] = stage
    _in_hand.clear()  # a new run: the stages the last one stopped in are told no more
    try:
        _write_holder(fd, stage, time.time(), _runs[path], brief)
        _last_stage = stage
        yield
    finally:
        del _held[path], _runs[path]
        os.ftruncate(fd, 0)
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


_last_stage: str | None = None
_outer: dict[str, str] = {}  # lock file -> what took it (the rebuild, a stage's own flow)
# The stages this process computes under its lock now, outermost first (a sweep's step
# inside the sweep); a stage that raised stays, as the one it stopped in
_in_hand: list[str] = []


def last_stage() -> str | None:
    """The stage this process's lock named last: the one in hand, or the one a run stopped in."""
    return _last_stage


def describe(info: dict) -> str:
    return _describe(info)


class CatalogBusyError(UserError):
    pass


# catalog.lock -> its descriptor, while this process writes what readers see
_commits: dict[str, int] = {}


def committing(workdir: Workdir) -> None:
    """This process is about to change what readers see: readers wait until end_commit
    (waits itself for the readers loading now, seconds at most)."""
    path = str(workdir.catalog_lock_path)
    if path in _commits:
        return
    workdir.catalog_lock_path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    fcntl.flock(fd, fcntl.LOCK_EX)
    _commits[path] = fd


def end_commit(workdir: Workdir) -> None:
    """The stage is recorded: readers may read again."""
    fd = _commits.pop(str(workdir.catalog_lock_path), None)
    if fd is None:
        return
    fcntl.flock(fd, fcntl.LOCK_UN)
    os.close(fd)


@contextmanager
def catalog_reading(workdir: Workdir, timeout: float = 120.0) -> Iterator[None]:
    """For a reader: the catalog as the last stage left it, never half-way through a
    stage's writes. Creates nothing (no lock file yet: no run has written since readers
    took care). A run still writing after `timeout` seconds: CatalogBusyError saying so."""
    try:
        fd = os.open(workdir.catalog_lock_path, os.O_RDONLY)
    except FileNotFoundError:
        yield
        return
    try:
        deadline = time.monotonic() + timeout
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    info = holder(workdir) or {}
                    raise CatalogBusyError(f"a mule run is writing the catalog of {workdir.root} ({_describe(info)}) "
                                           f"for more than {timeout:.0f} s; try again when it is done") from None  # fmt: skip
                time.sleep(0.05)
        yield
    finally:
        os.close(fd)  # releases the shared lock


class FolderBusyError(UserError):
    pass


@contextmanager
def folder_lock(folder, waiting: Callable[[str], None] | None = None, wait: bool = True) -> Iterator[None]:
    """`folder` (which exists) for this process's writes alone: an flock on the folder itself,
    so no file is left in it or beside it, and the kernel lets go when the holder dies; who
    holds it (command, pid, since when) is noted in the user's cache. A second writer
    (another `mule export` next to the same folder, a `mule embed` into the same store) is
    told who holds it through `waiting(who)` and waits for it, or without `wait` is refused
    in one line naming the holder (the commands: unless --wait, as the workdir's lock)."""
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    stat = os.fstat(fd)
    which = (stat.st_dev, stat.st_ino)
    if which in _folders:  # this process's own second writer would wait for itself forever
        os.close(fd)
        raise RuntimeError(f"{folder} is open for writing in this process already: close that first")
    note: Path | None = None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            who = _folder_holder(which)
            if not wait:
                raise FolderBusyError(f"{folder} is being written by {who}: run this again when it is done, or with "
                                      "--wait to wait for it") from None  # fmt: skip
            if waiting:
                waiting(who)
            fcntl.flock(fd, fcntl.LOCK_EX)
        _folders.add(which)
        note = _folder_note(which)
        try:
            write_json_atomic({"pid": os.getpid(), "command": _command_line(), "since": time.time(),
                               "folder": str(folder)}, note, crash_point=False)  # fmt: skip
        except OSError:  # a cache that cannot be written: a waiter is told less
            note = None
        yield
    finally:
        if which in _folders and note is not None:
            note.unlink(missing_ok=True)
        _folders.discard(which)
        os.close(fd)  # lets go of the lock


def _folder_note(which: tuple[int, int]) -> Path:
    from mule.storage.code_digests import cache_dir

    return cache_dir() / "locks" / f"folder-{which[0]}-{which[1]}.json"


def _folder_holder(which: tuple[int, int]) -> str:
    """Who holds a folder, as its note says: pid, command and since when."""
    try:
        info = json.loads(_folder_note(which).read_text())
        since = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(float(info["since"])))
        return f"pid {int(info['pid'])} (`{info['command']}`), since {since}"
    except (OSError, ValueError, KeyError, TypeError):
        return "another process (it does not say which: a mule from before holders were noted?)"


def _command_line() -> str:
    return " ".join(os.path.basename(a) if i == 0 else a for i, a in enumerate(sys.argv))


_folders: set[tuple[int, int]] = set()  # the folders this process holds (folder_lock)
