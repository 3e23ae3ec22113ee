"""What `mule serve` serves, loaded from a workdir a run may be writing, and kept current.

`load` opens the model (the registry's champion, or a version or run given) and its
gallery under the catalog's shared lock (storage.locks.catalog_reading): never a
stage's outputs half-written, and nothing written to the workdir. `Reloader` looks every
`period` seconds at what decides what is served (the champion's model file, the records
of the stages that write the gallery: ingest, features, index) and, when it changed,
loads the new model and gallery beside the old one, off the request path, and swaps them
in at once (serving.app.Live): a rebuild that registers a new champion or adds images is
served without a restart.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass

from mule.experiments.registry import resolve_model_file
from mule.serving import gallery as galleries
from mule.serving import retrieval
from mule.serving.app import Live, Served
from mule.storage.locks import catalog_reading
from mule.storage.workdir import Workdir

log = logging.getLogger("mule.serve")
# The stages whose outputs make the gallery: a new record of one of them is a new gallery
GALLERY_STAGES = ("ingest", "features", "index")


@dataclass(frozen=True)
class What:
    """Where a Served came from: the model file, and the gallery's stage records."""

    model: str
    records: tuple


@dataclass(frozen=True)
class Request:
    """What `mule serve` was asked to serve."""

    workdir: Workdir
    dataset: str
    run: str | None = None
    version: str | None = None
    split: str = "all"
    index: str = "auto"  # auto | on | off (the index stage's approximate index)
    breadth: int = 0
    min_images: int = galleries.MIN_INDEXED_IMAGES


def what(request: Request) -> What:
    """Cheap (one registry lookup and a few stats): what `load` would serve now."""
    path, _ = resolve_model_file(request.workdir, request.dataset, request.run, request.version)
    folder = request.workdir.state_dir / "stages" / request.dataset
    records = []
    for stage in GALLERY_STAGES:
        for record in sorted(folder.glob(f"{stage}*.json")):
            stat = record.stat()
            records.append((record.name, stat.st_mtime_ns, stat.st_size))
    return What(str(path), tuple(records))


def load(request: Request) -> tuple[Served, What, str]:
    """The model and its gallery, embedded; what they are; how images are searched."""
    with catalog_reading(request.workdir):
        source = what(request)
        opened = retrieval.open_searcher(request.workdir, request.dataset, request.run, request.version)
        gallery, how = galleries.open_gallery(opened, request.split, request.index, request.breadth, request.min_images)
    embedder = retrieval.embedder(opened)
    note = f"{opened.label}, loaded {time.strftime('%Y-%m-%d %H:%M:%S')}"
    return Served(embedder, gallery, note), source, how


class Reloader(threading.Thread):
    """Every `period` seconds: what would be served now; when it changed, load it and swap
    it in (a load that fails keeps serving the old, saying why)."""

    def __init__(self, request: Request, live: Live, source: What, period: float):
        super().__init__(name="mule-serve-reload", daemon=True)
        self.request, self.live, self.source, self.period = request, live, source, period
        self.stopped = threading.Event()

    def run(self) -> None:
        while not self.stopped.wait(self.period):
            self.check()

    def check(self) -> bool:
        """Reloads when what would be served changed; True when it swapped."""
        try:
            now = what(self.request)
            if now == self.source:
                return False
            served, source, how = load(self.request)
            served.embedder.warm_up()
        except Exception as error:  # noqa: BLE001 - keep serving what works; say why once per try
            log.warning("mule serve: could not load what changed (%s); still serving %s", error,
                        self.live.current.note)  # fmt: skip
            return False
        model_changed = source.model != self.source.model
        self.live.swap(served)
        self.source = source
        log.warning("mule serve: now serving %s (%s; %d images, searched by %s)", served.note,
                    "a new model" if model_changed else "a new gallery", len(served.gallery.image_ids), how)  # fmt: skip
        return True
