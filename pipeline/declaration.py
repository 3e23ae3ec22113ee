"""Every stage, declared once: the task that computes it, the catalog entries it reads
and writes (data_catalog.entries), the config it reads, and which of those options only
change how fast or where it runs.

Everything else is derived from this list: the CLI's stage names, the rebuild's order,
the Prefect flows (flows/stages.py) and prefect.yaml's test, the reuse keys
(pipeline.reuse: the code from the task module's imports, the config from `config`, the
inputs from `reads`, the outputs from `writes`), the stage a missing table's error
names, and the README's stage table (`python -m pipeline.declaration`).

Importing this module is cheap (no torch, no Prefect): the CLI reads it before anything
heavy starts.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


def _uses_mt(cfg) -> bool:
    return cfg.data.captions != "human"


def _lp_on(cfg) -> bool:
    return bool(cfg.pretrain.enabled)


def _lexicon_backend(cfg) -> bool:
    return cfg.translate.backend == "lexicon"


@dataclass(frozen=True)
class Read:
    """An entry a stage reads only under some config (`when(cfg)`)."""

    entry: str
    when: Callable[[Any], bool]
    condition: str  # what `when` tests, for people


@dataclass(frozen=True)
class Stage:
    name: str
    summary: str  # one line: the README's table, the flow's and the deployment's description
    task: str | None  # "module:function(workdir, config, run_id)"; None: a flow of its own (flows/stages.py)
    reads: tuple[str | Read, ...] = ()
    writes: tuple[str, ...] = ()
    config: tuple[str, ...] = ()  # option prefixes ("train.") and single options it reads
    operational: frozenset[str] = frozenset()  # read, but change how fast or where it runs, not its output
    ignores: frozenset[str] = frozenset()  # under a prefix it reads, but not its business
    slot: str | None = None  # the written entry whose file name tells one record of this stage from another
    # "module:function(workdir, config, generate=True) -> bool", run before the key is taken;
    # True when it had nothing to do; with generate=False it only says so
    prepare: str | None = None
    in_rebuild: bool = True  # part of `mule run all` / the rebuild; else run only when named

    @property
    def module(self) -> str:
        """The module whose import closure is the stage's code (data_catalog.code_digests)."""
        return (self.task or "").partition(":")[0]

    @property
    def keyed(self) -> bool:
        """Content-addressed: reused when its key is unchanged. The others decide model by model."""
        return self.task is not None

    def entries_read(self, cfg) -> list[str]:
        return [r for r in self.reads if isinstance(r, str)] + [r.entry for r in self.reads
                                                                 if isinstance(r, Read) and r.when(cfg)]  # fmt: skip

    def load_task(self) -> Callable:
        return _load(self.task)

    def load_prepare(self) -> Callable | None:
        return _load(self.prepare) if self.prepare else None


def _load(reference: str) -> Callable:
    module, _, name = reference.partition(":")
    return getattr(importlib.import_module(module), name)


_TRAINING = ("model.", "loss.", "train.", "pretrain.")
_FEATURE_IDENTITY = ("features.arch", "features.weights", "features.input_size", "features.resize", "features.crops",
                     "features.pool", "features.seed")  # fmt: skip

STAGES: tuple[Stage, ...] = (
    Stage("ingest", "Raw dataset files -> images, captions, rejects (generating the embedded dataset if needed).",
          task="tasks.ingest:ingest_captions", prepare="tasks.generate:generate_if_needed",
          reads=("raw files",), writes=("images", "captions", "rejects"),
          config=("data.",), operational=frozenset({"data.source", "data.images", "data.dictionaries"}),
          ignores=frozenset({"data.captions"})),
    Stage("translate", "Human captions -> machine-translated captions (translate.backend; cached, resumable).",
          task="tasks.translate:translate_captions",
          reads=("captions", Read("lexicons", _lexicon_backend, "translate.backend=lexicon")),
          writes=("mt captions", "translations"),
          config=("translate.", "data.dataset", "data.languages", "data.format"),
          operational=frozenset({"translate.concurrency", "translate.timeout_s", "translate.retries"})),
    Stage("features", "Image files -> CNN features (resumes after the last written part; in process or on Dask).",
          task="tasks.features:extract_features", reads=("images",), writes=("features",),
          config=("features.",),
          operational=frozenset({"features.runner", "features.dask_address", "features.dask_workers",
                                 "features.batch_size", "features.loader_workers", "features.shard_images",
                                 "features.engine", "features.device"})),
    Stage("text", "Captions -> vocabulary and word vectors per language (FastText).",
          task="tasks.text:build_word_vectors",
          reads=("captions", Read("mt captions", _uses_mt, "data.captions uses MT"), "vector files"),
          writes=("word vectors",),
          config=("text.", "data.dataset", "data.languages", "data.captions", "data.seed"),
          operational=frozenset({"text.fasttext_threads"})),
    Stage("pretrain", "LP: the MULE layers on sentences of the same image across languages.",
          task="tasks.pretrain:pretrain_mule",
          reads=("captions", Read("mt captions", _uses_mt, "data.captions uses MT"), "word vectors"),
          writes=("LP model",), slot="LP model",
          config=(*_TRAINING, "data.dataset", "data.languages", "data.captions", "text.max_tokens"),
          operational=frozenset({"train.reuse"}),
          ignores=frozenset({"train.model_name", "train.add_language", "train.base_model"})),
    Stage("train", "Joint training (triplet + NC + LC), best epoch on validation mR; registers the champion.",
          task="tasks.train:train_model",
          reads=("captions", Read("mt captions", _uses_mt, "data.captions uses MT"), "word vectors", "images",
                 "features", Read("LP model", _lp_on, "pretrain.enabled")),
          writes=("model",), slot="model",
          config=(*_TRAINING, "data.dataset", "data.languages", "data.captions", "text.max_tokens", "eval.ks",
                  *_FEATURE_IDENTITY),
          operational=frozenset({"train.reuse"})),
    Stage("evaluate", "Recall table per language on the test split, cross-lingual retrieval, figures.",
          task="tasks.evaluate:evaluate_model",
          reads=("captions", Read("mt captions", _uses_mt, "data.captions uses MT"), "word vectors", "images",
                 "features", Read("LP model", _lp_on, "pretrain.enabled"), "model"),
          writes=("evaluation",), slot="model",
          config=("eval.", "data.dataset", "data.languages", "text.max_tokens", "train.model_name",
                  *_FEATURE_IDENTITY)),
    Stage("ablation", "Baselines and MULE's parts (the paper's Table 2), one child run per model.",
          task=None, in_rebuild=False),
    Stage("add-language", "Adds train.add_language to a model trained without it; compares with training from scratch.",
          task=None, in_rebuild=False),
)  # fmt: skip

BY_NAME: dict[str, Stage] = {s.name: s for s in STAGES}
REBUILD: tuple[str, ...] = tuple(s.name for s in STAGES if s.in_rebuild)  # in pipeline order
NAMED_ONLY: tuple[str, ...] = tuple(s.name for s in STAGES if not s.in_rebuild)
ALL: tuple[str, ...] = REBUILD + NAMED_ONLY


def in_pipeline_order(stages) -> list[str]:
    """The named stages, each once, in the order the pipeline runs them."""
    return sorted(set(stages), key=ALL.index)


def writer_of(entry: str) -> str | None:
    """The stage that writes a catalog entry (for errors that say what to run)."""
    return next((s.name for s in STAGES if entry in s.writes), None)


def markdown_table() -> str:
    """The README's stage table."""
    def names(values) -> str:
        return ", ".join(values) or "–"

    lines = ["| stage | what it does | reads | writes | config |", "|---|---|---|---|---|"]
    for s in STAGES:
        if not s.keyed:
            lines.append(f"| `{s.name}` | {s.summary} (run when named) | | | |")
            continue
        reads = [r if isinstance(r, str) else f"{r.entry} (if {r.condition})" for r in s.reads]
        config = [c.rstrip(".") + ".*" if c.endswith(".") else c for c in s.config if not c.startswith("features.")
                  or c.endswith(".")] + (["features (identity)"] if any(c in _FEATURE_IDENTITY for c in s.config)
                                         else [])  # fmt: skip
        lines.append(f"| `{s.name}` | {s.summary} | {names(reads)} | {names(s.writes)} | {names(config)} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(markdown_table(), end="")
