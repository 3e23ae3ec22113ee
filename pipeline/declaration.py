"""Every stage, declared once: the function that computes it, the one that publishes what
it computed, the catalog entries it reads and writes (data_catalog.entries), the config
it reads, and which of those options only change how fast or where it runs.

Everything else is derived from this list: the CLI's stage names, the rebuild's order,
the Prefect flows (flows/stages.py) and prefect.yaml's test, the reuse keys
(pipeline.decisions: the code from the computing module's imports, the config from
`config`, the inputs from `reads`, the outputs from `writes`), what a sweep needs to
have run before it, the stage a missing table's error names, and the README's stage
table (`python -m mule.pipeline.declaration`).

Three kinds: the rebuild's stages, in order; sweeps (ablation, add-language), run when
named, which run stages again under other configs (variants), each keyed like any stage;
and steps, stages only sweeps run.

Importing this module is cheap (no torch, no Prefect): the CLI reads it before anything
heavy starts.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from mule.data_catalog.writers import written_by


def _uses_mt(cfg) -> bool:
    return cfg.data.captions != "human"


def _lp_on(cfg) -> bool:
    return bool(cfg.pretrain.enabled)


def _lexicon_backend(cfg) -> bool:
    return cfg.translate.backend == "lexicon"


def _from_text_stage(cfg) -> bool:
    """An added language starts from the text stage's word vectors (the paper's start)."""
    return cfg.add.start == "captions"


def _added_from_tables(cfg) -> bool:
    """The language being added is not one of the dataset's (its captions are in a table of their own)."""
    return bool(cfg.add.adding) and cfg.add.adding not in cfg.data.languages


def _any_added_from_tables(cfg) -> bool:
    return any(lang not in cfg.data.languages for lang in cfg.add.added)


def adds_to_a_trained_model(cfg) -> bool:
    """add-language adds its languages to a model trained before (add.base_model, else the
    rebuild's output.model_name), training nothing else; False for the study of one language of
    data.languages (trained without it, added, and every language from scratch)."""
    return bool(cfg.add.base_model) or _any_added_from_tables(cfg) or len(cfg.add.added) > 1


def add_language_upstream(cfg, stages: list[str]) -> list[str]:
    """The rebuild's stages add-language runs first: adding to a trained model, only those of
    the data (ingest, translate, features): the base's word vectors, LP and training are its
    own, used as they are (its model file is the base), never retrained or recomputed."""
    if adds_to_a_trained_model(cfg):
        return [s for s in stages if s not in ("text", "pretrain", "train")]
    return stages


def add_language_steps(cfg) -> tuple[str, ...]:
    """The steps add-language's variants run under this config (pipeline.sweeps)."""
    if adds_to_a_trained_model(cfg):
        captions = ("language-captions",) if _any_added_from_tables(cfg) else ()
        return (*captions, "extend", "evaluate", "query-translation")
    return (*(("pretrain",) if cfg.pretrain.enabled else ()), "train", "extend", "evaluate")


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
    # "module:compute(ctx: tasks.shared.context.StageContext) -> dict": what the stage computes; its
    # module's import closure is the code part of the stage's key. None for a sweep.
    task: str | None
    # "module:function(workdir, config, result, run_id) -> dict": the figures, reports, MLflow
    # metrics and models made from what it computed, after it returns; outside the key
    publish: str | None = None
    reads: tuple[str | Read, ...] = ()
    config: tuple[str, ...] = ()  # option prefixes ("train.") and single options it reads
    operational: frozenset[str] = frozenset()  # read, but change how fast or where it runs, not its output
    ignores: frozenset[str] = frozenset()  # under a prefix it reads, but not its business
    # read for whether it is set, not for its value: keyed as "given" or "none" (evaluate
    # computes the generated dataset's ceiling only when no data.source names other files)
    presence: frozenset[str] = frozenset()
    slot: str | None = None  # the written entry whose file name tells one record of this stage from another
    # "module:function(workdir, config, generate=True) -> bool", run before the key is taken;
    # True when it had nothing to do; with generate=False it only says so
    prepare: str | None = None
    kind: str = "rebuild"  # "rebuild" (in `mule run all`, in order), "sweep" (when named), "step" (in sweeps)
    # A sweep: "module:Sweep" (pipeline.sweeps: its variants and its report), and the stages
    # its variants run; the rebuild's stages that write what those read run before it.
    sweep: str | None = None
    steps: tuple[str, ...] = ()
    # a sweep whose steps depend on the config: the steps it runs under `cfg` (of `steps`)
    steps_for: Callable[[Any], tuple[str, ...]] | None = None
    # (cfg, the rebuild's stages that write what its steps read) -> those it runs first
    upstream_for: Callable[[Any, list[str]], list[str]] | None = None
    # trains with torch: the device and arithmetic it trains in (train.device resolved, and
    # train.amp on CUDA) are part of its key; the CPU threads it used are recorded with it
    threaded: bool = False
    # what it keeps of its own work when a run is stopped in it (the command's last line says so)
    resumes: str = ""

    @property
    def module(self) -> str:
        """The module whose import closure is the stage's code (storage.code_digests)."""
        return (self.task or "").partition(":")[0]

    @property
    def writes(self) -> tuple[str, ...]:
        """The catalog entries it writes: data_catalog.writers, the one map of who writes what."""
        return written_by(self.name)

    @property
    def sections(self) -> frozenset[str]:
        """The config sections its computation is handed (config.stage_view.declared_sections)."""
        return frozenset(option.split(".", 1)[0] for option in self.config)

    @property
    def keyed(self) -> bool:
        """Content-addressed: reused when its key is unchanged. Sweeps are not: each of their
        steps is, variant by variant."""
        return self.task is not None

    @property
    def in_rebuild(self) -> bool:
        return self.kind == "rebuild"

    def entries_read(self, cfg) -> list[str]:
        return [r for r in self.reads if isinstance(r, str)] + [r.entry for r in self.reads
                                                                 if isinstance(r, Read) and r.when(cfg)]  # fmt: skip

    def load_task(self) -> Callable:
        return _load(self.task)

    def load_prepare(self) -> Callable | None:
        return _load(self.prepare) if self.prepare else None

    def load_publish(self) -> Callable | None:
        return _load(self.publish) if self.publish else None

    def load_sweep(self) -> Callable:
        return _load(self.sweep)


def _load(reference: str) -> Callable:
    module, _, name = reference.partition(":")
    return getattr(importlib.import_module(module), name)


_TRAINING = ("model.", "loss.", "train.", "pretrain.")
_FEATURE_IDENTITY = ("features.arch", "features.weights", "features.weights_file", "features.input_size",
                     "features.resize", "features.crops", "features.pool", "features.seed")  # fmt: skip
# Where a model trains, not what it learns; a trained model's name is its record's slot.
# train.device: the device kind it resolves to, with its arithmetic, is the key's (a
# threaded stage's runtime part); train.threads only moves the weights within rounding.
_PLACEMENT = frozenset({"train.device", "train.threads"})
# Where the raw files are: their content is the key's ("raw files", "lexicons"), not their path.
_WHERE = ("data.source", "data.images", "data.dictionaries")
# Options of the training sections LP does not use: joint training's schedule and the
# image-sentence loss.
_NOT_LP = frozenset({"train.epochs", "train.lr", "train.lr_decay", "train.decay_steps", "train.warmup_steps",
                     "train.ema", "train.batch_images", "train.sentences_per_image_many", "loss.match_weight",
                     "loss.nc", "loss.nc_weight"})  # fmt: skip
_MT = Read("mt captions", _uses_mt, "data.captions uses MT")
_ADDED = Read("added captions", _added_from_tables, "the language added is not in data.languages")
_EVERY_ADDED = Read("added languages' captions", _any_added_from_tables,
                    "add.languages names languages outside data.languages")  # fmt: skip
_LP = Read("LP model", _lp_on, "pretrain.enabled")
_PUBLISH = "mule.pipeline.publish:"

STAGES: tuple[Stage, ...] = (
    Stage("ingest", "Raw dataset files -> images, captions, rejects (generating the embedded dataset if needed).",
          task="mule.tasks.ingest:compute", publish=_PUBLISH + "ingest", prepare="mule.tasks.shared.preparation:generated_dataset",
          reads=("raw files",),
          config=("data.", "text.tokenizers"),
          operational=frozenset({"data.source", "data.images", "data.dictionaries", "data.extra_captions"}),
          ignores=frozenset({"data.captions"})),
    Stage("translate", "Human captions -> machine-translated captions (translate.backend; cached, resumable).",
          task="mule.tasks.translate:compute", publish=_PUBLISH + "translate",
          reads=("captions", Read("lexicons", _lexicon_backend, "translate.backend=lexicon")),
          config=("translate.", "data.dataset", "data.languages", "data.format", "data.captions", "text.tokenizers",
                  *_WHERE),
          operational=frozenset({"translate.concurrency", "translate.timeout_s", "translate.retries"}) | frozenset(_WHERE), resumes="the sentences translated so far"),
    Stage("features", "Image files -> CNN features, stored under what made them (extractor, weights, code).",
          task="mule.tasks.features:compute", publish=_PUBLISH + "features",
          prepare="mule.tasks.shared.preparation:extractor_weights", reads=("images", "extractor weights"),
          config=("features.", "data.strict", "data.dataset", "data.source"),
          # engine and device are where it runs; the arithmetic they imply is in the vectors'
          # identity (mule_core.backbones.numerics)
          operational=frozenset({"features.runner", "features.dask_address", "features.dask_workers",
                                 "features.batch_size", "features.loader_workers", "features.shard_images",
                                 "features.engine", "features.device", "data.source"}), resumes="the images extracted so far"),
    Stage("text", "Captions -> vocabulary and word vectors per language (fastText, or multilingual-e5: vectors.init).",
          task="mule.tasks.text:compute", publish=_PUBLISH + "text",
          reads=("captions", _MT, "vector files"),
          # model.subwords / ngram_lengths: which n-grams get the word-vector model's vectors
          config=("text.", "vectors.", "data.dataset", "data.languages", "data.captions", "data.seed",
                  "model.subwords", "model.ngram_lengths")),
    Stage("pretrain", "LP: the MULE layers on sentences of the same image across languages.",
          task="mule.tasks.pretrain:compute", publish=_PUBLISH + "pretrain",
          reads=("captions", _MT, "word vectors"), slot="LP model",
          config=(*_TRAINING, "data.dataset", "data.languages", "data.captions", "text.max_tokens", "text.tokenizers"),
          operational=_PLACEMENT, ignores=_NOT_LP, threaded=True, resumes="its checkpoint of the last finished epoch"),
    Stage("train", "Joint training (triplet + NC + LC), best epoch on validation mR; registers the champion.",
          task="mule.tasks.train:compute", publish=_PUBLISH + "train",
          reads=("captions", _MT, "word vectors", "images", "features", _LP), slot="model",
          config=(*_TRAINING, "output.", "data.dataset", "data.languages", "data.captions", "text.max_tokens",
                  "text.tokenizers", "eval.ks", *_FEATURE_IDENTITY),
          operational=_PLACEMENT, threaded=True, resumes="its checkpoint of the last finished epoch"),
    Stage("evaluate", "Recall table per language on the test split, cross-lingual retrieval, figures.",
          task="mule.tasks.evaluate:compute", publish=_PUBLISH + "evaluate",
          # the LP model is what a dataset without images is evaluated with
          reads=("captions", "images", "features", "model", _LP, _EVERY_ADDED), slot="model",
          config=("eval.", "data.dataset", "output.model_name", "data.train_images", "data.val_images",
                  "data.test_images", "data.seed", "data.image_size", "data.source", "train.device",
                  "add.languages", "data.languages"),
          operational=frozenset({"train.device"}), presence=frozenset({"data.source"})),
    Stage("index", "The gallery's approximate index (FAISS HNSW or IVF, 8-bit) over the model's image vectors, for mule serve.",
          task="mule.tasks.index:compute", publish=_PUBLISH + "index",
          reads=("images", "features", "model"), slot="model",
          config=("index.kind", "index.cells", "data.dataset", "output.model_name")),
    Stage("language-captions", "An added language's captions of the dataset's images (its rows in the dataset's "
          "files, data.extra_captions, --captions tables), in a table of their own (add-language's step).",
          task="mule.tasks.language_captions:compute", publish=_PUBLISH + "language_captions", kind="step",
          reads=("raw files", "images", "caption files"), slot="added captions",
          config=("data.", "text.tokenizers", "add.languages", "add.captions"),
          operational=frozenset({"data.source", "data.images", "data.dictionaries", "data.extra_captions",
                                 "add.captions"}),
          ignores=frozenset({"data.captions", "data.languages", "data.train_images", "data.val_images",
                             "data.test_images", "data.image_size"})),
    Stage("extend", "Trains a new language's branch onto a frozen trained model (add-language's step).",
          task="mule.tasks.extend:compute", publish=_PUBLISH + "extend", kind="step",
          reads=("captions", _MT, Read("word vectors", _from_text_stage, "add.start=captions"), "images",
                 "features", "base model", _ADDED),
          slot="model",
          config=(*_TRAINING, "add.", "output.model_name", "output.tables", "data.dataset", "data.languages", "data.captions",
                  "text.tokenizers", "eval.ks", "eval.split", *_FEATURE_IDENTITY),
          operational=_PLACEMENT, ignores=frozenset({"add.captions"}), threaded=True,
          resumes="its checkpoints of the last finished epoch (LP, then joint training)"),
    Stage("query-translation", "A model's English branch searched with other languages' queries translated word by word "
          "(a lexicon, else induced from translated captions, else aligned by multilingual-e5).",
          task="mule.tasks.query_translation:compute", publish=_PUBLISH + "query_translation",
          kind="step", reads=("captions", "word vectors", "images", "features", "model", "lexicons", _EVERY_ADDED),
          slot="model",
          config=("eval.", "data.dataset", "data.languages", "output.model_name", "train.device", "add.languages",
                  "translate.induced_iterations", "text.tokenizers", *_WHERE),
          operational=frozenset({"train.device"}) | frozenset(_WHERE)),
    Stage("ablation", "Baselines and MULE's parts (the paper's Table 2), one child run per model.",
          task=None, kind="sweep", sweep="mule.pipeline.sweeps:ABLATION",
          steps=("pretrain", "train", "evaluate", "query-translation"), resumes="the variants finished"),
    Stage("add-language", "Adds add.languages to a trained model (from zero captions, the "
          "dataset's, or --captions tables), or studies one: trained without it, added, and from scratch.",
          task=None, kind="sweep", sweep="mule.pipeline.sweeps:ADD_LANGUAGE",
          steps=("pretrain", "train", "language-captions", "extend", "evaluate", "query-translation"),
          steps_for=add_language_steps, upstream_for=add_language_upstream,
          resumes="the steps finished"),
)  # fmt: skip

BY_NAME: dict[str, Stage] = {s.name: s for s in STAGES}
REBUILD: tuple[str, ...] = tuple(s.name for s in STAGES if s.kind == "rebuild")  # in pipeline order
SWEEPS: tuple[str, ...] = tuple(s.name for s in STAGES if s.kind == "sweep")
STEPS: tuple[str, ...] = tuple(s.name for s in STAGES if s.kind == "step")
ALL: tuple[str, ...] = REBUILD + SWEEPS  # what `mule run` takes


def checked_stages(names: list[str] | None) -> list[str]:
    """The stages a command or a flow names, in pipeline order: none or "all" is the
    rebuild; a name that is no stage is refused, with the names there are."""
    from mule.mule_core.settings import ConfigError

    stages = list(REBUILD) if not names or list(names) == ["all"] else list(names)
    unknown = [s for s in stages if s not in ALL]
    if unknown:
        raise ConfigError(f"unknown stage(s) {', '.join(unknown)}; stages are: {', '.join(ALL)}, all")
    return in_pipeline_order(stages)


def in_pipeline_order(stages) -> list[str]:
    """The named stages, each once, in the order the pipeline runs them."""
    return sorted(set(stages), key=ALL.index)


def writer_of(entry: str) -> str | None:
    """The rebuild stage that writes a catalog entry (for errors that say what to run)."""
    return next((s.name for s in STAGES if entry in s.writes and s.kind == "rebuild"), None)


def _writers_of(entries: list[str], cfg) -> list[str]:
    """The rebuild's stages that write these entries, and what those read, in order."""
    needed, todo = set(), list(entries)
    while todo:
        writer = writer_of(todo.pop())
        if writer and writer not in needed:
            needed.add(writer)
            todo += BY_NAME[writer].entries_read(cfg)
    return in_pipeline_order(needed)


def upstream(sweep: str, cfg) -> list[str]:
    """The rebuild's stages that write what a sweep's steps read (and what those read), in
    order: they run before it, and reuse makes them free when they are up to date. What
    the steps write themselves (LP models, models) is made per variant."""
    declared = BY_NAME[sweep]
    steps = [BY_NAME[s] for s in (declared.steps_for(cfg) if declared.steps_for else declared.steps)]
    made_by_steps = {entry for step in steps for entry in step.writes}
    needed = _writers_of([e for step in steps for e in step.entries_read(cfg) if e not in made_by_steps], cfg)
    return declared.upstream_for(cfg, needed) if declared.upstream_for else needed


def writers_upstream(stages, cfg) -> list[str]:
    """The rebuild's stages that write what `stages` read, and what those read, in order."""
    return _writers_of([e for s in stages for e in BY_NAME[s].entries_read(cfg)], cfg)


def with_upstream(stages, cfg) -> list[str]:
    """The stages named, and what the sweeps among them need, in pipeline order."""
    return in_pipeline_order([*stages, *(u for s in stages if BY_NAME[s].kind == "sweep" for u in upstream(s, cfg))])


def markdown_table() -> str:
    """The README's stage table."""
    def names(values) -> str:
        return ", ".join(values) or "–"

    lines = ["| stage | what it does | reads | writes | config |", "|---|---|---|---|---|"]
    for s in STAGES:
        if s.kind == "sweep":
            steps = ", ".join(f"`{step}`" for step in s.steps)
            lines.append(f"| `{s.name}` | {s.summary} Run when named: {steps} per variant. | | | |")
            continue
        reads = [r if isinstance(r, str) else f"{r.entry} (if {r.condition})" for r in s.reads]
        config = [c.rstrip(".") + ".*" if c.endswith(".") else c for c in s.config if not c.startswith("features.")
                  or c.endswith(".")] + (["features (identity)"] if any(c in _FEATURE_IDENTITY for c in s.config)
                                         else [])  # fmt: skip
        name = f"`{s.name}` (step)" if s.kind == "step" else f"`{s.name}`"
        lines.append(f"| {name} | {s.summary} | {names(reads)} | {names(s.writes)} | {names(config)} |")
    return "\n".join(lines) + "\n"


def keys_table() -> str:
    """What each keyed stage's key holds (docs/architecture.md): its inputs, its config,
    the repository files its computing module reaches and the libraries they import."""
    from mule.storage.code_digests import closure, libraries

    lines = ["| stage | inputs | config (less operational) | code: files reached | libraries |", "|---|---|---|---|---|"]
    for s in STAGES:
        if not s.keyed:
            continue
        modules, outside = closure(s.module)
        packages: dict[str, int] = {}
        for name in modules:
            top = name.split(".")[1]  # mule.<folder>....
            packages[top] = packages.get(top, 0) + 1
        files = f"`{s.module.removeprefix('mule.').replace('.', '/')}.py` + " + ", ".join(
            f"{n} in {p}/" for p, n in sorted(packages.items()) if n)  # fmt: skip
        reads = [r if isinstance(r, str) else f"{r.entry} (if {r.condition})" for r in s.reads]
        config = [c.rstrip(".") + ".*" if c.endswith(".") else c for c in s.config]
        less = sorted(s.operational | s.ignores)
        config_text = ", ".join(config) + (f"; not {', '.join(less)}" if less else "") + (
            f"; {', '.join(sorted(s.presence))} only whether given" if s.presence else "")  # fmt: skip
        libs = ", ".join(sorted(libraries(outside), key=str.lower))
        lines.append(f"| `{s.name}` | {', '.join(reads)} | {config_text} | {files} | {libs} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    import sys

    print(keys_table() if sys.argv[1:] == ["keys"] else markdown_table(), end="")
