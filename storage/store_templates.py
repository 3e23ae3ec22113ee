"""Empty databases made once per library version and copied into new workdirs.

MLflow's and Prefect's SQLite stores are made by running their schema migrations from
nothing: about 1 s for MLflow's and 4 s for Prefect's on 2 cores (more on a busy
machine), paid by every new workdir (every `mule demo`, every test). The first workdir
on a machine makes the template in the user's cache (`~/.cache/mule/templates/`, keyed
by the library's version); the next copy it. A template that does not read is made
again; without a writable cache the library makes its own database, as before.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sqlite3
from collections.abc import Callable
from pathlib import Path

from mule.storage.atomic import write_atomic
from mule.storage.code_digests import cache_dir
from mule.storage.workdir import sqlite_problem

log = logging.getLogger("mule.catalog")


def copy_database(source: Path, dest: Path) -> None:
    """An SQLite database copied whole (SQLite's backup: its WAL included), then renamed into
    place (storage.atomic: the one writer of a file that takes another's place)."""

    def copy(tmp: Path) -> None:
        with contextlib.closing(sqlite3.connect(f"{source.as_uri()}?mode=ro", uri=True)) as src, \
                contextlib.closing(sqlite3.connect(tmp)) as out:  # fmt: skip
            src.backup(out)
            out.execute("PRAGMA journal_mode=DELETE")  # one file; the library sets its own mode when it opens it

    write_atomic(dest, copy, crash_point=False)


def from_template(dest: Path, name: str, make: Callable[[Path], None]) -> bool:
    """Makes the database `dest` (which must not exist yet) a copy of the template `name`,
    first making the template with make(path) where the cache has none. False when
    nothing was copied (dest exists, or no template could be made): the caller's library
    then makes its own database."""
    if dest.exists():
        return False
    template = cache_dir() / "templates" / f"{name}.db"
    if not template.exists() or sqlite_problem(template):
        tmp = template.with_name(f".{template.name}.tmp-{os.getpid()}")
        try:
            template.parent.mkdir(parents=True, exist_ok=True)
            tmp.unlink(missing_ok=True)
            make(tmp)
            if not tmp.exists() or sqlite_problem(tmp):
                raise RuntimeError(f"{tmp} was not made, or does not read")
            copy_database(tmp, template)  # the WAL folded in: one file
        except Exception as error:  # noqa: BLE001 - a template is an optimisation: never fail a run for it
            log.debug("no %s template (%s): the library makes its own database", name, error)
            return False
        finally:
            for leftover in tmp.parent.glob(f"{tmp.name}*"):  # with its -wal and -shm
                if leftover.is_file():
                    leftover.unlink(missing_ok=True)
    dest.parent.mkdir(parents=True, exist_ok=True)
    copy_database(template, dest)
    return True
