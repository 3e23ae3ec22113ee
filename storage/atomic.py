"""The one way anything in the workdir is written: to a temporary file beside its final
name, then renamed over it. A crash leaves the old file or the new one, never half of
one; the temporaries of killed writers are removed by the next writer. The temporary file is
synced to the disk before the rename, and the folder after it: a power cut never leaves
an empty or half-written file under the final name.

Every write passes a named point between the temporary file and the rename
(`write:<folder>/<file>`; the translate stage's journal passes `journal:<dataset>`). In a
normal run nothing listens there (POINTS is empty). It is the one seam for the tests that
kill a stage at the worst moment: storage.faults hooks into it, only when a test asks
for it (MULE_CRASH_AT, MULE_BUG_AT; the command installs it then).
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

# Called with the point's name at every write point; empty unless faults.install() ran.
POINTS: list[Callable[[str], None]] = []


def point(name: str) -> None:
    for hook in POINTS:
        hook(name)


def process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


# A temporary of another machine (a Dask worker's, on a shared file system) is judged by its
# age: no PID of ours says whether its writer lives. No write takes a day.
FOREIGN_STALE_S = 24 * 3600


def _host() -> str:
    return socket.gethostname().replace("-", "_") or "host"


def temporary_name(path: Path) -> Path:
    """Where `path` is written before it takes its name: .<name>.tmp-<host>-<pid>; from a
    thread other than the main one (two threads may write the same file: a Dask worker's
    thread, a server's), .<name>.t<thread>.tmp-<host>-<pid>."""
    thread = "" if threading.current_thread() is threading.main_thread() else f".t{threading.get_native_id()}"
    return path.with_name(f".{path.name}{thread}.tmp-{_host()}-{os.getpid()}")


def remove_stale_temporaries(path: Path) -> None:
    """Temporary files that killed writers left beside `path`, whatever their name (feature
    parts are never written twice under one name): this machine's of a PID that is gone
    (and those named before hosts were: .<name>.tmp-<pid>), and another machine's a day old."""
    host = _host()
    for tmp in path.parent.glob(".*.tmp-*"):
        writer = tmp.name.rsplit(".tmp-", 1)[-1]
        where, _, pid = writer.rpartition("-")
        if not pid.isdigit():
            continue
        if where in ("", host):
            stale = int(pid) != os.getpid() and not process_alive(int(pid))
        else:
            try:
                stale = time.time() - tmp.stat().st_mtime > FOREIGN_STALE_S
            except FileNotFoundError:
                continue
        if stale:
            tmp.unlink(missing_ok=True)


@contextmanager
def atomic_path(path: Path, crash_point: bool = True) -> Iterator[Path]:
    """Yields the temporary path to write; on leaving without an error it replaces `path`."""
    path.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_temporaries(path)
    tmp = temporary_name(path)
    try:
        yield tmp
        _sync(tmp)  # its bytes on the disk before its name: a power cut leaves the old file or the new one, whole
        if crash_point and POINTS:
            point(f"write:{path.parent.name}/{path.name}")
        os.replace(tmp, path)
        _sync(path.parent)  # and the rename itself
    finally:
        tmp.unlink(missing_ok=True)


def _sync(path: Path) -> None:
    """fsync a file or a folder (a rename is the folder's change). A file system that cannot
    sync a folder (some network ones) says so with EINVAL: nothing more can be done there."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    except OSError as error:
        if error.errno not in (errno.EINVAL, errno.ENOTSUP):
            raise
    finally:
        os.close(fd)


def write_atomic(path: Path, write: Callable[[Path], Any], crash_point: bool = True) -> Path:
    """write(tmp) writes the content; then it takes path's place."""
    with atomic_path(path, crash_point) as tmp:
        write(tmp)
    return path


def write_text_atomic(text: str, path: Path, crash_point: bool = True) -> Path:
    return write_atomic(path, lambda tmp: tmp.write_text(text, encoding="utf-8"), crash_point)


def write_json_atomic(data: Any, path: Path, compact: bool = False, crash_point: bool = True) -> Path:
    text = (json.dumps(data, separators=(",", ":")) if compact
            else json.dumps(data, indent=2, sort_keys=True, default=str))  # fmt: skip
    return write_text_atomic(text, path, crash_point)


CACHE_FORMAT = "mule-cache-1"


def write_json_cache(value: Any, path: Path, crash_point: bool = False) -> Path:
    """A cache file, atomically: its value beside the SHA-256 of the value as written, so a
    reader tells a file mule wrote whole from one cut, edited by hand or left by another
    version (read_json_cache)."""
    text = json.dumps(value, separators=(",", ":"))
    digest = hashlib.sha256(text.encode()).hexdigest()
    return write_text_atomic(f'{{"format":"{CACHE_FORMAT}","sha256":"{digest}","value":{text}}}', path, crash_point)


def read_json_cache(path: Path, valid: Callable[[Any], bool]) -> Any:
    """A cache file's value when write_json_cache wrote it whole (its digest matches) and it
    is of the shape `valid` accepts; None when it is missing, unreadable, cut, edited, nested
    past what JSON reads, or of another shape: the caller computes what it held again and
    writes it back, so a bad cache costs time once, never a run."""
    try:
        data = json.loads(Path(path).read_text())
        if not (isinstance(data, dict) and data.get("format") == CACHE_FORMAT and "value" in data):
            return None
        value = data["value"]
        text = json.dumps(value, separators=(",", ":"))
        if hashlib.sha256(text.encode()).hexdigest() != data.get("sha256"):
            return None
        return value if valid(value) else None
    except (OSError, ValueError, UnicodeDecodeError, RecursionError, TypeError, AttributeError):
        return None


def is_map_of(value: Any, valid: Callable[[Any], bool]) -> bool:
    """A JSON object whose keys are strings and whose values `valid` accepts."""
    return isinstance(value, dict) and all(isinstance(k, str) and valid(v) for k, v in value.items())


def is_strings(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(item, str) for item in value)
