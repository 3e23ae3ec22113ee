"""The one way anything in the workdir is written: to a temporary file beside its final
name, then renamed over it. A crash leaves the old file or the new one, never half of
one; the temporaries of killed writers are removed by the next writer.

Every write passes a named point between the temporary file and the rename
(`write:<folder>/<file>`; the translate stage's journal passes `journal:<dataset>`). In a
normal run nothing listens there (POINTS is empty). It is the one seam for the tests that
kill a stage at the worst moment: data_catalog.faults hooks into it, only when a test asks
for it (MULE_CRASH_AT, MULE_BUG_AT; the command installs it then).
"""

from __future__ import annotations

import json
import os
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


def remove_stale_temporaries(path: Path) -> None:
    """Temporary files that killed writers left beside `path` (.<name>.tmp-<pid> of a dead
    pid), whatever their name: feature parts are never written twice under one name."""
    for tmp in path.parent.glob(".*.tmp-*"):
        pid = tmp.name.rsplit("-", 1)[-1]
        if pid.isdigit() and int(pid) != os.getpid() and not process_alive(int(pid)):
            tmp.unlink(missing_ok=True)


@contextmanager
def atomic_path(path: Path, crash_point: bool = True) -> Iterator[Path]:
    """Yields the temporary path to write; on leaving without an error it replaces `path`."""
    path.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_temporaries(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        yield tmp
        if crash_point and POINTS:
            point(f"write:{path.parent.name}/{path.name}")
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


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
