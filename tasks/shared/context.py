"""What a stage's computation is handed: the workdir and its catalog, the resolved config,
the stage's key, and someone to tell how it is going.

A computation reads the catalog entries its stage declares, writes the ones it declares,
and returns a summary (JSON-able: it is recorded with the stage's key, and is what a
reused stage returns). It never publishes: no MLflow, no figures, no Prefect. Those
follow it (pipeline.publish), so a plot's style, a tracking library or the orchestrator
are not part of what a stage's key says it was computed by. Live progress (a training
curve as it grows, a divergence when it happens) goes to `report`, which is MLflow in a
pipeline run and no one in a test.
"""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from mule.data_catalog import queries
from mule.data_catalog.declared import DeclaredCatalog
from mule.data_catalog.tables import Catalog
from mule.mule_core.errors import UserError

if TYPE_CHECKING:
    from mule.config.sections import MuleConfig
    from mule.storage.workdir import Workdir


class Reporter(Protocol):
    def metrics(self, values: dict[str, float], step: int | None = None) -> None: ...

    def tags(self, values: dict[str, str]) -> None: ...


class Silent:
    """A reporter no one listens to."""

    def metrics(self, values: dict[str, float], step: int | None = None) -> None:
        pass

    def tags(self, values: dict[str, str]) -> None:
        pass


@dataclass
class StageContext:
    workdir: Workdir
    cfg: MuleConfig
    key: str = ""  # the stage's key for this run: what a checkpoint must match to be resumed
    force: bool = False  # --force: redo even what a rerun would keep (features: every image)
    report: Reporter = field(default_factory=Silent)
    # What to do once the result is recorded (pipeline.runner): e.g. remove a checkpoint,
    # which must outlive the computation until its result cannot be lost
    after_record: list = field(default_factory=list)
    # The stage and the catalog entries it declares (what it reads and writes): the catalog
    # it is handed reaches those alone (data_catalog.declared). None: the whole catalog.
    stage: str = ""
    entries: frozenset[str] | None = None

    @functools.cached_property
    def catalog(self) -> Catalog:
        if self.entries is None:
            return Catalog(self.workdir)
        return DeclaredCatalog(Catalog(self.workdir), self.stage, self.entries)  # type: ignore[return-value]

    @property
    def dataset(self) -> str:
        return self.cfg.data.dataset


class NoImagesError(UserError, RuntimeError):
    pass


def images_with_files(catalog: Catalog, dataset: str) -> tuple[list[str], list[str], list[dict]]:
    """(image ids with a file, their paths, rows of the images without one); an error that
    says what to do when the dataset has no image file at all."""
    rows = queries.image_rows(catalog, dataset)
    present = [r for r in rows if r["exists"]]
    if not present:
        folder = rows[0]["path"].rsplit("/", 1)[0] if rows else "?"
        raise NoImagesError(
            f"dataset {dataset!r} has no image files ({len(rows)} images listed, none found under {folder}). "
            "The image stages (features, train, evaluate) need the images; text-only stages "
            "(ingest, text, pretrain) work without them. Point --images at the image folder "
            "(for Multi30K: the Flickr30K images) and rerun ingest."
        )
    return [r["image_id"] for r in present], [r["path"] for r in present], [r for r in rows if not r["exists"]]


def logger() -> logging.Logger:
    """The stages' logger. In a Prefect run its records reach the run's log too (flows.environment
    names "mule" among Prefect's extra loggers)."""
    return logging.getLogger("mule.tasks")
