"""The catalog's named entries: what stages read and write (pipeline.declaration names
them), where each one lives under a config, and what kind of content it is, which says
how its digest is taken for the reuse keys (pipeline.reuse).

Kinds: "table" (a Parquet file), "file", "files", "tree" (every file under a folder),
"images" (the images table's identity, split and bytes, not its paths: a moved workdir
keeps its keys), "model" (a saved model's weights and vocabularies, not its file).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from .catalog import Catalog
from .datasets import locate
from .workdir import Workdir


@dataclass(frozen=True)
class Entry:
    name: str
    kind: str
    locate: Callable[[Workdir, Catalog, object], list[Path]]  # (workdir, catalog, MuleConfig) -> paths


def _extractor(cfg) -> str:
    from mule_core.extractor_names import extractor_name

    f = cfg.features
    return extractor_name(f.arch, f.weights, f.input_size, f.resize, f.crops, f.seed, f.pool)


def _raw_files(wd: Workdir, catalog: Catalog, cfg) -> list[Path]:
    source = locate(wd, cfg.data)
    outside = [] if source.images.is_relative_to(source.root) else [source.images]
    return [source.root, *outside]


def _lexicons(wd: Workdir, catalog: Catalog, cfg) -> list[Path]:
    return [Path(cfg.data.dictionaries) if cfg.data.dictionaries else locate(wd, cfg.data).root / "dictionaries"]


def _table(name: str, suffix: str = "") -> Callable:
    return lambda wd, catalog, cfg: [wd.table_path(name, cfg.data.dataset + suffix)]


ENTRIES: dict[str, Entry] = {e.name: e for e in (
    Entry("raw files", "tree", _raw_files),
    Entry("lexicons", "tree", _lexicons),
    Entry("images", "images", _table("images")),
    Entry("captions", "table", _table("captions")),
    Entry("rejects", "table", _table("rejects")),
    Entry("mt captions", "table", _table("captions", ".mt")),
    Entry("translations", "table", _table("translations")),
    Entry("features", "tree", lambda wd, catalog, cfg: [wd.features_dir(cfg.data.dataset, _extractor(cfg))]),
    Entry("vector files", "files", lambda wd, catalog, cfg: [Path(p) for p in cfg.text.vectors.values()]),
    Entry("word vectors", "table", _table("word_vectors")),
    Entry("LP model", "model", lambda wd, catalog, cfg: [catalog.lp_model_path(cfg.data)]),
    Entry("model", "model", lambda wd, catalog, cfg: [wd.model_path(cfg.data.dataset, cfg.train.model_name)]),
    Entry("evaluation", "file",
          lambda wd, catalog, cfg: [wd.model_results_dir(cfg.data.dataset, cfg.train.model_name) / "evaluation.json"]),
)}  # fmt: skip

# Which catalog table each entry is, for the errors that name a missing table's stage.
TABLE_ENTRIES = {"images": "images", "captions": "captions", "rejects": "rejects", "word_vectors": "word vectors",
                 "translations": "translations", "features": "features"}  # fmt: skip


def output_files(entry: Entry, paths: list[Path]) -> list[Path]:
    """The files a written entry consists of: a folder's parts, a file that exists."""
    files: list[Path] = []
    for path in paths:
        if entry.kind == "tree":
            files += sorted(path.glob("part-*.parquet"))
        elif path.exists():
            files.append(path)
    return files
