"""The one way anything in the workdir is written: to a temporary file beside its final
name, then renamed over it. A crash leaves the old file or the new one, never half of
one; the temporaries of killed writers are removed by the next writer.

Every write is also a crash point (data_catalog.faults), between the temporary file and
the rename, for the tests that kill a stage at the worst moment.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from .faults import remove_stale_temporaries, write_point


@contextmanager
def atomic_path(path: Path, crash_point: bool = True) -> Iterator[Path]:
    """Yields the temporary path to write; on leaving without an error it replaces `path`."""
    path.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_temporaries(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        yield tmp
        if crash_point:
            write_point(path)
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
