"""The workdir's MLflow store (mlflow.db, SQLite): made from a template, checked readable,
its stored artifact paths read and moved with the workdir, and refused when it points
outside it."""

from __future__ import annotations

import contextlib
import sqlite3
from pathlib import Path
from typing import TYPE_CHECKING

from mule.mule_core.errors import UserError
from mule.storage.workdir import Workdir

if TYPE_CHECKING:  # MLflow is imported when a run is tracked, not by checking the store (seconds)
    pass


# Columns of MLflow's SQLite store that hold absolute artifact locations (MLflow 3.x schema).
ARTIFACT_COLUMNS = (
    ("experiments", "artifact_location"),
    ("runs", "artifact_uri"),
    ("logged_models", "artifact_location"),
    ("model_versions", "source"),
    ("model_versions", "storage_location"),
)


class WorkdirError(UserError, RuntimeError):
    """The workdir's stores point outside it, and mule cannot tell how to fix them."""

def _store(workdir: Workdir) -> Path:
    return workdir.root / "mlflow.db"


def seed_store(workdir: Workdir) -> bool:
    """A new workdir's MLflow store copied from the template for this MLflow version
    (storage/store_templates.py), instead of migrated from nothing; its Default
    experiment's artifact location is made this workdir's. False when the store existed."""
    from importlib.metadata import version

    from mule.storage.store_templates import from_template

    def make(path: Path) -> None:
        import shutil

        from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore

        artifacts = path.with_name(path.name + ".artifacts")
        store = SqlAlchemyStore(f"sqlite:///{path}", str(artifacts))
        store.engine.dispose()
        shutil.rmtree(artifacts, ignore_errors=True)

    if not from_template(_store(workdir), f"mlflow-{version('mlflow')}", make):
        return False
    with contextlib.closing(sqlite3.connect(_store(workdir))) as con, con:
        con.execute("UPDATE experiments SET artifact_location = ? WHERE name = 'Default'",
                    (str(workdir.artifacts_dir / "0"),))  # fmt: skip
    return True


def store_exists(workdir: Workdir) -> bool:
    """The workdir has an MLflow store (a reader must not make one by asking)."""
    return _store(workdir).exists()


def _columns(con: sqlite3.Connection) -> list[tuple[str, str]]:
    present = []
    for table, column in ARTIFACT_COLUMNS:
        names = {row[1] for row in con.execute(f"PRAGMA table_info({table})")}
        if column in names:
            present.append((table, column))
    return present


def recorded_artifact_root(workdir: Workdir) -> Path | None:
    """The workdir that this store's experiments were created in, read off their artifact
    location (<root>/mlartifacts); None when the store is new or has no experiment."""
    if not _store(workdir).exists():
        return None
    with contextlib.closing(sqlite3.connect(_store(workdir))) as con:
        try:
            locations = [row[0] for row in con.execute("SELECT artifact_location FROM experiments")]
        except sqlite3.OperationalError:  # no tables yet
            return None
    for location in locations:
        path = Path(location.removeprefix("file://")) if location else None
        if path is not None and path.name == workdir.artifacts_dir.name and path != workdir.artifacts_dir:
            return path.parent
    return None


def relocate_store(workdir: Workdir, old_root: Path) -> int:
    """Rewrites the artifact locations that pointed into old_root to point into this
    workdir. Returns the number of rows changed."""
    if not _store(workdir).exists():
        return 0
    prefixes = [(old_root.as_uri() + "/", workdir.root.as_uri() + "/"), (f"{old_root}/", f"{workdir.root}/")]
    changed = 0
    with contextlib.closing(sqlite3.connect(_store(workdir))) as con, con:
        for table, column in _columns(con):
            for old, new in prefixes:
                changed += con.execute(
                    f"UPDATE {table} SET {column} = ? || substr({column}, ?) WHERE substr({column}, 1, ?) = ?",
                    (new, len(old) + 1, len(old), old),
                ).rowcount
    return changed


def check_store(workdir: Workdir) -> None:
    """Refuses to run on an MLflow store that cannot be read: mule cannot repair it."""
    from mule.storage.workdir import sqlite_problem

    problem = sqlite_problem(_store(workdir))
    if problem:
        store = _store(workdir)
        raise WorkdirError(
            f"the MLflow store {store} cannot be read ({problem}); mule cannot repair it. Put back a copy from a "
            f"backup, or move it aside (mv {store} {store}.damaged) to start a new run history: the catalog, models "
            "and stage records stay, so nothing is computed again (the registry is in the store: a model is "
            "registered again the next time train runs)"
        )


def check_self_contained(workdir: Workdir) -> None:
    """Refuses to run when an experiment would write its artifacts outside this workdir."""
    if not _store(workdir).exists():
        return
    artifacts = workdir.artifacts_dir.as_uri()
    with contextlib.closing(sqlite3.connect(_store(workdir))) as con:
        try:
            rows = con.execute("SELECT name, artifact_location FROM experiments").fetchall()
        except sqlite3.OperationalError:
            return
    for name, location in rows:
        location = location or ""
        if name != "Default" and location != artifacts and not location.startswith(artifacts + "/"):
            raise WorkdirError(
                f"MLflow experiment {name!r} in {_store(workdir)} keeps its artifacts at {location}, outside "
                f"this workdir ({workdir.root}); mule will not write there. Copy the workdir with its "
                "mlartifacts/ folder, or start from a new workdir."
            )
