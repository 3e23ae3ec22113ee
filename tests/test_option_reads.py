"""Every option a stage's computation reads is one its declaration names
(pipeline.declaration), so every option that can change what a stage computes is in its
key. Each stage's computation runs on a copy of the tiny rebuilt workdir with a config
that records every option read; one read but not declared (or declared as ignored) fails.

Reads made by dataclasses' own functions (asdict, replace: a model file stores the whole
config; a section copied with one change) are not counted: they copy, they do not decide."""

from __future__ import annotations

import dataclasses
import shutil
import sys

import pytest

from mule.pipeline.config import SECTIONS, MuleConfig, resolve
from mule.pipeline.declaration import BY_NAME, REBUILD
from tests.conftest import REBUILT_TINY

_NOT_DECIDING = {dataclasses.__file__, "<string>"}  # dataclasses' functions, and the methods they generate


class Reads:
    """Which options were read while `on`."""

    def __init__(self):
        self.options: set[str] = set()
        self.on = False


def recording(cfg: MuleConfig, reads: Reads) -> MuleConfig:
    """`cfg` whose sections note each field read (and sections copied from them, too)."""
    sections = {}
    for name in SECTIONS:
        section = getattr(cfg, name)
        fields = {f.name for f in dataclasses.fields(section)}

        def getattribute(self, attr, _name=name, _fields=fields):
            if reads.on and attr in _fields and sys._getframe(1).f_code.co_filename not in _NOT_DECIDING:
                reads.options.add(f"{_name}.{attr}")
            return object.__getattribute__(self, attr)

        cls = type(f"Recording{type(section).__name__}", (type(section),), {"__getattribute__": getattribute})
        sections[name] = cls(**{f: getattr(section, f) for f in fields})
    return dataclasses.replace(cfg, **sections)


def undeclared(stage_name: str, options: set[str]) -> list[str]:
    stage = BY_NAME[stage_name]
    declared = [w for w in stage.config]
    return sorted(k for k in options if k in stage.ignores
                  or not any(k == w or (w.endswith(".") and k.startswith(w)) for w in declared))  # fmt: skip


def run_recorded(wd, stage_name: str, overrides: dict | None = None) -> set[str]:
    """The options the stage's computation read, run on `wd` under the tiny config."""
    from mule.pipeline.runner import prepare
    from mule.tasks.support.context import StageContext

    reads = Reads()
    cfg = recording(resolve("demo", {**REBUILT_TINY, **(overrides or {})}), reads)
    prepare(wd, cfg, stage_name)
    ctx = StageContext(wd, cfg, key=f"options-{stage_name}", force=True)
    reads.on = True
    try:
        BY_NAME[stage_name].load_task()(ctx)
    finally:
        reads.on = False
    return reads.options


@pytest.fixture(scope="module")
def workdir(rebuilt_as_built, tmp_path_factory):
    from mule.data_catalog.workdir import Workdir
    from mule.experiments.relocation import adopt

    copy = tmp_path_factory.mktemp("options") / "work"
    shutil.copytree(rebuilt_as_built[0].root, copy)
    wd = Workdir.at(copy)
    adopt(wd)
    return wd


def test_the_recorder_sees_reads_and_not_copies():
    reads = Reads()
    cfg = recording(resolve("demo"), reads)
    reads.on = True
    _ = cfg.train.epochs, dataclasses.asdict(cfg), dataclasses.replace(cfg.loss, lc=False).margin
    assert reads.options == {"train.epochs", "loss.margin"}
    assert undeclared("pretrain", {"train.epochs", "loss.margin", "index.kind"}) == ["index.kind", "train.epochs"]


@pytest.mark.slow
@pytest.mark.parametrize("name", REBUILD)
def test_a_stage_s_computation_reads_only_options_it_declares(name, workdir):
    options = run_recorded(workdir, name)
    assert options, f"{name} read no option at all?"
    missing = undeclared(name, options)
    assert not missing, f"{name} reads {missing} without declaring them"


@pytest.mark.slow
def test_the_sweeps_steps_read_only_options_they_declare(workdir):
    """extend (adding a language to a model trained without it) and query-translation (an
    English model read through lexicons), each on a tiny model trained for it."""
    without_cs = {"data.languages": "en,de,fr", "train.model_name": "without-cs", "train.epochs": 2,
                  "pretrain.epochs": 1}  # fmt: skip
    run_recorded(workdir, "pretrain", without_cs)
    run_recorded(workdir, "train", without_cs)
    options = run_recorded(workdir, "extend", {"train.add_language": "cs", "train.model_name": "without-cs+cs",
                                               "train.epochs": 2, "pretrain.epochs": 1})  # fmt: skip
    missing = undeclared("extend", options)
    assert not missing, f"extend reads {missing} without declaring them"
    english = {"data.languages": "en", "train.model_name": "english", "train.epochs": 2, "pretrain.enabled": False}
    run_recorded(workdir, "train", english)
    options = run_recorded(workdir, "query-translation", english)
    missing = undeclared("query-translation", options)
    assert not missing, f"query-translation reads {missing} without declaring them"


def test_a_stage_is_handed_only_the_sections_it_declares():
    import copy

    from mule.pipeline.config import UndeclaredSectionError, declared_sections

    index = BY_NAME["index"]
    assert index.sections == {"index", "data", "train"}
    cfg = declared_sections(resolve("demo"), index.name, index.sections)
    assert cfg.index.kind == "hnsw-sq8" and cfg.train.model_name == "model"
    with pytest.raises(UndeclaredSectionError, match=r"stage index read translate.backend, and its declaration"):
        cfg.translate.backend  # noqa: B018
    assert copy.deepcopy(cfg).features is cfg.features  # a copy of the config (a sweep's variant) keeps it so
