"""Every option a stage's computation reads is one its declaration names
(pipeline.declaration), so every option that can change what a stage computes is in its
key. Each stage's computation runs on a copy of the tiny rebuilt workdir with a config
that records every option read; one read but not declared (or declared as ignored) fails,
and so does an operational one (declared, but left out of the key) unless it only says
where or how fast the stage runs (PLACEMENT). The stages run under the demo config and
under the configs that take other paths through them: LP off, machine-translated
captions, multilingual-e5 word vectors, the table and COCO layouts. (CUDA is not run
here: no GPU on the machines the suite runs on.)

Reads made by dataclasses.replace (a section copied with one change) are not counted:
they copy, they do not decide. Those made through dataclasses.asdict are, unless the
caller stores the whole config (a model file, MLflow's params, a key): a section turned
into a dict and read from there is a read all the same."""

from __future__ import annotations

import dataclasses
import shutil
import sys

import pytest

from mule.config.resolution import resolve
from mule.config.sections import SECTIONS, MuleConfig
from mule.pipeline.declaration import BY_NAME, REBUILD
from tests.conftest import REBUILT_TINY

_NOT_DECIDING = {dataclasses.__file__, "<string>"}  # dataclasses' functions, and the methods they generate
# Who may turn a whole section into a dict without deciding anything by it: they store it.
STORING = {("model_files.py", "save_model"), ("settings.py", "flatten"), ("overrides.py", "to_dict"),
           ("tracking.py", "run")}  # fmt: skip
LOCATING = ("data.source", "data.images", "data.dictionaries", "data.extra_captions")
KEY_CONTENT = {"ingest", "translate", "features", "query-translation"}  # they read, and key, what is there
# Operational options a computation may read: they say where or how fast it runs, and what
# that changes is keyed otherwise (the device's arithmetic, the raw files' content).
PLACEMENT = {
    "train.device": "the device: its arithmetic is keyed (runtime arithmetic)",
    "train.threads": "the CPU threads: recorded; 1 and 2 move the weights within rounding (test_stage_keys)",
    # where the raw files are, for the stages that key their content (raw files, lexicons, images)
    "data.source": "where the raw files are", "data.images": "where the image files are",
    "data.dictionaries": "where the lexicons are", "data.extra_captions": "where more captions are (xFlickr&CO)",
    "translate.concurrency": "how many requests at once", "translate.timeout_s": "how long one waits",
    "translate.retries": "how often a failed one is asked again",
    "features.runner": "threads or Dask", "features.dask_address": "which cluster", "features.dask_workers": "its size",
    "features.batch_size": "images a batch", "features.loader_workers": "decoding processes",
    "features.shard_images": "images a part", "features.device": "the device: its arithmetic is the identity's",
    "features.engine": "PyTorch or ONNX Runtime: the identity's arithmetic names it",
}  # fmt: skip


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
            if reads.on and attr in _fields and _deciding(sys._getframe(1)):
                reads.options.add(f"{_name}.{attr}")
            return object.__getattribute__(self, attr)

        cls = type(f"Recording{type(section).__name__}", (type(section),), {"__getattribute__": getattribute})
        sections[name] = cls(**{f: getattr(section, f) for f in fields})
    return dataclasses.replace(cfg, **sections)


def _deciding(frame) -> bool:
    """A read that can decide something: any but dataclasses' copies (replace), and asdict's
    when its caller stores the whole section."""
    if frame.f_code.co_filename not in _NOT_DECIDING:
        return True
    while frame is not None and frame.f_code.co_filename in _NOT_DECIDING:
        if frame.f_code.co_name in ("replace", "_replace"):
            return False
        frame = frame.f_back
    while frame is not None and frame.f_code.co_name in ("<dictcomp>", "<listcomp>", "<genexpr>"):
        frame = frame.f_back  # a comprehension's frame: its function's
    if frame is None:
        return False
    return (frame.f_code.co_filename.rpartition("/")[2], frame.f_code.co_name) not in STORING


def undeclared(stage_name: str, options: set[str]) -> list[str]:
    """Options read that the key does not hold for what they decide: not declared, declared
    as ignored, or operational without being a placement (PLACEMENT)."""
    stage = BY_NAME[stage_name]
    declared = [w for w in stage.config]
    def placement(k: str) -> bool:
        return k in PLACEMENT and (k not in LOCATING or stage_name in KEY_CONTENT)

    return sorted(k for k in options if k in stage.ignores or (k in stage.operational and not placement(k))
                  or not any(k == w or (w.endswith(".") and k.startswith(w)) for w in declared))  # fmt: skip


def run_recorded(wd, stage_name: str, overrides: dict | None = None) -> set[str]:
    """The options the stage's computation read, run on `wd` under the tiny config."""
    from mule.pipeline.runner import prepare
    from mule.tasks.shared.context import StageContext

    reads = Reads()
    cfg = recording(resolve("demo", {**REBUILT_TINY, **(overrides or {})}), reads)
    prepare(wd, cfg, stage_name)
    import uuid

    # a key of its own: a checkpoint another config's run left is not resumed
    stage = BY_NAME[stage_name]  # the catalog it is handed reaches only its declared entries, as in a run
    ctx = StageContext(wd, cfg, key=f"options-{stage_name}-{uuid.uuid4().hex}", force=True, stage=stage_name,
                       entries=frozenset(stage.entries_read(cfg)) | frozenset(stage.writes))  # fmt: skip
    reads.on = True
    try:
        BY_NAME[stage_name].load_task()(ctx)
    finally:
        reads.on = False
    return reads.options


@pytest.fixture(scope="module")
def workdir(rebuilt_as_built, tmp_path_factory):
    from mule.experiments.relocation import adopt
    from mule.storage.workdir import Workdir

    copy = tmp_path_factory.mktemp("options") / "work"
    shutil.copytree(rebuilt_as_built[0].root, copy)
    wd = Workdir.at(copy)
    adopt(wd)
    return wd


def test_the_recorder_sees_reads_and_not_copies():
    from mule.mule_core.settings import flatten

    reads = Reads()
    cfg = recording(resolve("demo"), reads)
    reads.on = True
    _ = cfg.train.epochs, flatten(cfg), dataclasses.replace(cfg.loss, lc=False).margin
    assert reads.options == {"train.epochs", "loss.margin"}
    _ = dataclasses.asdict(cfg.index)["kind"]  # a section read through a dict: a read of each of its options
    assert {"index.kind", "index.cells", "index.breadth"} <= reads.options
    assert undeclared("pretrain", {"train.epochs", "loss.margin", "index.kind"}) == ["index.kind", "train.epochs"]
    # an operational option is fine read only where it says where or how fast a stage runs
    assert undeclared("train", {"train.device"}) == [] and undeclared("evaluate", {"data.source"}) == []
    assert undeclared("ingest", {"data.source"}) == [] and "data.source" in BY_NAME["evaluate"].presence


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
    without_cs = {"data.languages": "en,de,fr", "output.model_name": "without-cs", "train.epochs": 2,
                  "pretrain.epochs": 1}  # fmt: skip
    run_recorded(workdir, "pretrain", without_cs)
    run_recorded(workdir, "train", without_cs)
    options = run_recorded(workdir, "extend", {"add.languages": "cs", "output.model_name": "without-cs+cs",
                                               "train.epochs": 2, "pretrain.epochs": 1, "add.words": 1000})  # fmt: skip
    missing = undeclared("extend", options)
    assert not missing, f"extend reads {missing} without declaring them"
    english = {"data.languages": "en", "output.model_name": "english", "train.epochs": 2, "pretrain.enabled": False}
    run_recorded(workdir, "train", english)
    options = run_recorded(workdir, "query-translation", english)
    missing = undeclared("query-translation", options)
    assert not missing, f"query-translation reads {missing} without declaring them"


def test_a_stage_is_handed_only_the_sections_it_declares():
    import copy

    from mule.config.stage_view import UndeclaredSectionError, declared_sections

    index = BY_NAME["index"]
    assert index.sections == {"index", "data", "output"}  # not train: the model's name is output's
    cfg = declared_sections(resolve("demo"), index.name, index.sections)
    assert cfg.index.kind == "hnsw-sq8" and cfg.output.model_name == "model"
    with pytest.raises(UndeclaredSectionError, match=r"stage index read translate.backend, and its declaration"):
        cfg.translate.backend  # noqa: B018
    assert copy.deepcopy(cfg).features is cfg.features  # a copy of the config (a sweep's variant) keeps it so


VARIANTS = {  # the configs that take other paths through the stages, and the stages they change
    "LP off": ({"pretrain.enabled": False}, ("pretrain", "train", "evaluate")),
    "MT captions": ({"data.captions": "human+mt"}, ("text", "pretrain", "train")),
    "multilingual-e5 word vectors": ({"vectors.init": "multilingual-e5"}, ("text",)),
}


@pytest.mark.slow
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_the_stages_read_only_declared_options_on_their_other_paths(variant, workdir, tmp_path):
    overrides, stages = VARIANTS[variant]
    copy = tmp_path / "work"
    shutil.copytree(workdir.root, copy)
    from mule.storage.workdir import Workdir

    wd = Workdir.at(copy)
    for name in stages:
        missing = undeclared(name, run_recorded(wd, name, overrides))
        assert not missing, f"{name} ({variant}) reads {missing} without declaring them"


@pytest.mark.slow
@pytest.mark.parametrize("dataset", ["embedded-table", "embedded-coco"])
def test_ingest_reads_only_declared_options_of_the_table_and_coco_layouts(dataset, tmp_path):
    from mule.storage.workdir import Workdir

    tiny = {"data.dataset": dataset, "data.train_images": 24, "data.val_images": 8, "data.test_images": 8,
            "data.image_size": 32}  # fmt: skip
    missing = undeclared("ingest", run_recorded(Workdir.at(tmp_path / "work"), "ingest", tiny))
    assert not missing, f"ingest ({dataset}) reads {missing} without declaring them"
