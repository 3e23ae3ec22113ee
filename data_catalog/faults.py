"""Crash points, for the tests that kill a stage and rerun it.

`MULE_CRASH_AT=<pattern>[@n]` makes the process kill itself with SIGKILL (no cleanup, no
finally, like a power cut or the OOM killer) the n-th time it passes a point whose name
matches the glob pattern. Every atomic write is a point, between writing its temporary
file and renaming it into place: `write:<folder>/<file>` (write:captions/embedded.parquet,
write:*/part-00001.parquet, write:embedded/model-checkpoint.pt); so is every translation
appended to the translate stage's journal (journal:<dataset>). Unset, a point costs one
dictionary lookup.

`MULE_BUG_AT=<pattern>` raises an internal error there instead: a FileNotFoundError for a
path no user gave, the kind of bug that must keep its traceback (exit 1, mule.error_kind=bug)
and never be reported as bad input.
"""

from __future__ import annotations

import os
import signal
from fnmatch import fnmatch
from pathlib import Path

_hits: dict[str, int] = {}


class InjectedBug(FileNotFoundError):
    """What MULE_BUG_AT raises: an internal error, not one of mule's input checks."""


def crash_point(name: str) -> None:
    bug = os.environ.get("MULE_BUG_AT")
    if bug and fnmatch(name, bug):
        raise InjectedBug(2, "No such file or directory (injected by MULE_BUG_AT)", f"/internal/{name}")
    spec = os.environ.get("MULE_CRASH_AT")
    if not spec:
        return
    pattern, _, nth = spec.partition("@")
    if fnmatch(name, pattern):
        _hits[pattern] = _hits.get(pattern, 0) + 1
        if _hits[pattern] >= int(nth or 1):
            os.kill(os.getpid(), signal.SIGKILL)


def write_point(path: Path) -> None:
    crash_point(f"write:{path.parent.name}/{path.name}")


def remove_stale_temporaries(path: Path) -> None:
    """Temporary files that killed writers left beside `path` (.<name>.tmp-<pid> of a dead
    pid), whatever their name: feature parts are never written twice under one name."""
    for tmp in path.parent.glob(".*.tmp-*"):
        pid = tmp.name.rsplit("-", 1)[-1]
        if pid.isdigit() and int(pid) != os.getpid() and not process_alive(int(pid)):
            tmp.unlink(missing_ok=True)


def process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
