"""Fault injection, for the tests that kill a stage and rerun it: hooks into the write
points of storage.atomic (its one seam), never imported by a normal run.

`MULE_CRASH_AT=<pattern>[@n]` makes the process kill itself with SIGKILL (no cleanup, no
finally, like a power cut or the OOM killer) the n-th time it passes a point whose name
matches the glob pattern. Every atomic write is a point, between writing its temporary
file and renaming it into place: `write:<folder>/<file>` (write:captions/embedded.parquet,
write:*/part-00001.parquet, write:embedded/model-checkpoint.pt); so is every translation
appended to the translate stage's journal (journal:<dataset>).

`MULE_BUG_AT=<pattern>` raises an internal error there instead: a FileNotFoundError for a
path no user gave, the kind of bug that must keep its traceback (exit 1, mule.error_kind=bug)
and never be reported as bad input.

`install()` (the command, commands/main.py, calls it when either variable is set) hooks `crash_point` in.
"""

from __future__ import annotations

import os
import signal
from fnmatch import fnmatch

from mule.storage import atomic

_hits: dict[str, int] = {}


class InjectedBug(FileNotFoundError):
    """What MULE_BUG_AT raises: an internal error, not one of mule's input checks."""


def wanted() -> bool:
    return bool(os.environ.get("MULE_CRASH_AT") or os.environ.get("MULE_BUG_AT"))


def install() -> None:
    if crash_point not in atomic.POINTS:
        atomic.POINTS.append(crash_point)


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
