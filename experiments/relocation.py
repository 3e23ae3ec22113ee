"""A workdir that was copied or moved becomes its own before anything runs in it.

Three stores keep absolute paths: MLflow's artifact locations, DuckDB's views and the
images table's file paths (for the generated dataset, which lives in the workdir). A
copy left as it is would log its runs into the original's `mlartifacts/` and read the
original's tables. `adopt` rewrites those paths when the workdir's recorded root
differs from where it is now, then checks that nothing points outside it.
"""

from __future__ import annotations

import logging
from pathlib import Path

from mule.data_catalog.tables import Catalog
from mule.experiments import mlflow_store
from mule.storage.content_digests import restamp_outputs
from mule.storage.workdir import Workdir

log = logging.getLogger("mule.relocation")


def adopt(workdir: Workdir) -> Path | None:
    """Makes the workdir self-contained; returns the root it was moved or copied from, if any."""
    mlflow_store.check_store(workdir)
    previous = workdir.recorded_root() or mlflow_store.recorded_artifact_root(workdir)
    moved = previous is not None and previous != workdir.root
    if moved:
        tables = Catalog(workdir).relocate(previous)
        restamp_outputs(workdir, tables)  # new paths, same images: ingest need not run again
        rows = mlflow_store.relocate_store(workdir, previous)
        log.warning(
            "workdir %s was copied or moved from %s: pointed the image paths of %d tables and %d MLflow "
            "artifact locations at the new place, so nothing is written into the old one",
            workdir.root, previous, len(tables), rows,
        )  # fmt: skip
    mlflow_store.check_self_contained(workdir)
    if moved or workdir.recorded_root() is None:
        workdir.record_root()
    return previous if moved else None
