"""Shared fixtures. Prefect's home goes to a temporary folder before Prefect is imported."""

from __future__ import annotations

import atexit
import gzip
import os
import shutil
import tempfile
import tomllib
from pathlib import Path

import pytest

# pytester: tests/test_leaks.py runs a session inside one; tests.leaks: processes a test left running fail the run
pytest_plugins = ["pytester", "tests.leaks"]

# Under pytest-xdist each worker gets one CPU thread for torch/ONNX Runtime (and so do
# the mule processes the tests start): two workers each running two threads on two cores
# spin against each other, and the suite's training tests ran 3-4x slower.
if os.environ.get("PYTEST_XDIST_WORKER"):
    for _variable in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(_variable, "1")

_PREFECT_HOME = Path(tempfile.mkdtemp(prefix="mule-tests-prefect-"))
os.environ.pop("PREFECT_API_URL", None)
os.environ["PREFECT_HOME"] = str(_PREFECT_HOME)
_scratch = [_PREFECT_HOME]
if "MULE_HOME" not in os.environ:
    _scratch.append(Path(tempfile.mkdtemp(prefix="mule-tests-home-")))
    os.environ["MULE_HOME"] = str(_scratch[-1])


def _remove_scratch(owner: int = os.getpid()) -> None:
    """The session's Prefect home and MULE_HOME go when its process ends (every run left
    about 3 MB in /tmp); not in the processes forked from it (tests/forked.py), which share them."""
    if os.getpid() == owner:
        for folder in _scratch:
            shutil.rmtree(folder, ignore_errors=True)


atexit.register(_remove_scratch)  # registered first, so it runs last: after Prefect stops its server
# Prefect logs "Stopping temporary server" at exit, after pytest has closed its capture.
os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")

from mule.flows.environment import prepare_environment, seed_prefect_home  # noqa: E402
from mule.storage.code_digests import REPO, code_parts  # noqa: E402

prepare_environment(_PREFECT_HOME)
seed_prefect_home()  # the worker's Prefect database from the template, as `mule` makes a workdir's

SHARED_MULTI30K = Path(__file__).resolve().parents[2] / "shared" / "datasets" / "multi30k"


@pytest.fixture(scope="session", autouse=True)
def _local_flow_settings():
    """Flows in the tests run as `mule` runs them locally (no heartbeats: see flows.prefect_server)."""
    from mule.flows.prefect_server import local_flow_settings

    with local_flow_settings():
        yield


@pytest.fixture(scope="session")
def prefect_api_url() -> str:
    """The session's ephemeral Prefect server (the one in-process flows use), for mule
    subprocesses: they skip starting a server of their own."""
    from prefect.server.api.server import SubprocessASGIServer

    server = SubprocessASGIServer()
    server.start()
    return server.api_url


@pytest.fixture(scope="session")
def forker(prefect_api_url):
    """`mule` commands forked from a process that has imported mule (tests/forked.py), on
    the session's Prefect server."""
    from tests.forked import Forker

    env = {k: v for k, v in os.environ.items() if k != "MULE_CRASH_AT"}
    env |= {"PREFECT_API_URL": prefect_api_url, "MULE_PREFECT_HEARTBEATS": "off"}  # read when Prefect is imported
    forking = Forker(env)
    yield forking
    forking.close()


@pytest.fixture
def shared_multi30k() -> Path:
    if not (SHARED_MULTI30K / "data").is_dir():
        pytest.skip(f"real Multi30K text not found at {SHARED_MULTI30K}")
    return SHARED_MULTI30K


def write_gz(path: Path, lines: list[str] | bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    data = lines if isinstance(lines, bytes) else "".join(line + "\n" for line in lines).encode()
    with gzip.open(path, "wb") as handle:
        handle.write(data)


def write_text(path: Path, lines: list[str]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")


# A hand-written Multi30K checkout: 2 train images, 1 val, 1 test.
TINY = {
    "train": {
        "images": ["100.jpg", "200.jpg"],
        "task2_en": [["A dog runs.", "A brown dog."], ["Two men talk.", "Men at work."]],  # [image][caption]
        "task2_de": [["Ein Hund rennt.", "Ein brauner Hund."], ["Zwei Männer reden.", "Männer bei der Arbeit."]],
        "task1": {
            "en": ["A brown dog.", "Two men chatting."],  # 1st repeats a task2 line, 2nd does not
            "de": ["Ein brauner Hund.", "Zwei Männer plaudern."],
            "fr": ["Un chien brun.", "Deux hommes discutent."],
            "cs": ["Hnědý pes.", "Dva muži si povídají."],
        },
    },
    "val": {
        "images": ["300.jpg"],
        "task2_en": [["A cat sleeps.", "A sleeping cat."]],
        "task2_de": [["Eine Katze schläft.", "Eine schlafende Katze."]],
        "task1": {
            "en": ["A cat sleeps."],
            "de": ["Eine Katze schläft."],
            "fr": ["Un chat dort."],
            "cs": ["Kočka spí."],
        },
    },
    "test": {
        "images": ["400.jpg"],
        "task2_en": [["A red car.", "A car on a road."]],
        "task2_de": [["Ein rotes Auto.", "Ein Auto auf einer Straße."]],
        "task1": {
            "en": ["A red car."],
            "de": ["Ein rotes Auto."],
            "fr": ["Une voiture rouge."],
            "cs": ["Červené auto."],
        },
    },
}
STEMS = {"train": ("train", "train"), "val": ("val", "val"), "test": ("test_2016_flickr", "test_2016")}


def write_tiny_multi30k(root: Path) -> Path:
    for split, spec in TINY.items():
        stem1, stem2 = STEMS[split]
        write_text(root / "data/task1/image_splits" / f"{stem1}.txt", spec["images"])
        write_text(root / "data/task2/image_splits" / f"{stem2}_images.txt", spec["images"])
        for lang, lines in spec["task1"].items():
            write_gz(root / "data/task1/raw" / f"{stem1}.{lang}.gz", lines)
        for lang in ("en", "de"):
            per_image = spec[f"task2_{lang}"]
            for k in range(len(per_image[0])):
                write_gz(root / "data/task2/raw" / f"{stem2}.{k + 1}.{lang}.gz", [caps[k] for caps in per_image])
    return root


@pytest.fixture
def tiny_multi30k(tmp_path: Path) -> Path:
    return write_tiny_multi30k(tmp_path / "multi30k")


# The rebuild flow's tiny run, shared by tests/test_rebuild_flow.py and tests/test_serving.py.
REBUILT_TINY = {
    "data.train_images": 48,
    "data.val_images": 16,
    "data.test_images": 24,
    "data.image_size": 48,
    "features.input_size": 32,
    "vectors.fasttext_epochs": 3,
    "text.word_dim": 64,  # the mechanics, not the default dimension: faster
    "pretrain.epochs": 2,
    "pretrain.batch_images": 16,
    "train.epochs": 10,  # 30 steps: enough to fit the training images clearly above chance
    "train.batch_images": 16,
    "loss.mining_warmup_steps": 3,  # one epoch of 48 images
    "pretrain.mining_warmup_steps": 3,  # LP's: one epoch too
    "eval.examples": 1,
    "features.shard_images": 32,  # several parts, to check that extraction resumes
}
# Test files that share a session fixture run on one pytest-xdist worker (else each
# worker would build it): file -> group. Every other file is a group of its own, as
# --dist loadfile would make it.
SHARED_WORKER = {"test_serving": "test_rebuild_flow", "test_stage_keys": "test_rebuild_flow",
                 "test_option_reads": "test_rebuild_flow", "test_readers": "test_rebuild_flow",
                 "test_aligned_start": "test_rebuild_flow", "test_add_language": "test_rebuild_flow",
                 # `never_interrupted` and the forking process (`forker`), made once for the three
                 "test_crashes": "test_stopping", "test_publishing": "test_stopping"}


@pytest.fixture(scope="session")
def rebuilt(tmp_path_factory):
    """(workdir, results) of the whole pipeline on a tiny generated dataset. Tests that
    change it copy it first, or run after those that only read it."""
    from mule.flows.stages import rebuild_flow
    from mule.storage.workdir import Workdir

    workdir = tmp_path_factory.mktemp("rebuild")
    results = rebuild_flow(workdir=str(workdir), preset="demo", overrides=REBUILT_TINY)
    shutil.copytree(workdir, workdir.with_name(workdir.name + "-as-built"))  # for the tests that need it untouched
    return Workdir.at(workdir), results


@pytest.fixture(scope="session")
def rebuilt_as_built(rebuilt):
    """A copy of `rebuilt`'s workdir taken right after it was built (the tests in
    test_rebuild_flow.py change the original in place)."""
    from mule.experiments.relocation import adopt
    from mule.storage.workdir import Workdir

    copy = Workdir.at(rebuilt[0].root.with_name(rebuilt[0].root.name + "-as-built"))
    adopt(copy)  # its own image paths and MLflow artifacts, as `mule` makes a copied workdir
    return copy, rebuilt[1]


def worker_group(nodeid: str) -> str:
    """The group of a test's file: SHARED_WORKER's, else the file's own name."""
    module = nodeid.split("::")[0].rpartition("/")[2].removesuffix(".py")
    return SHARED_WORKER.get(module, module)


# The slowest groups first (`pytest --durations=0`, 2 cores, 2026-11-26: the rebuild group
# 170 worker-seconds, stopping with crashes and publishing 144, cli 46, multi30k_real 37,
# ablation 30, damage 30, ...), so that neither worker is left with a long one at the end.
SLOWEST_FIRST = ("test_rebuild_flow", "test_stopping", "test_cli", "test_damage", "test_multi30k_real",
                 "test_ablation_flow", "test_features_stage", "test_table_flow", "test_schedules", "test_bad_input",
                 "test_coco_flow", "test_store_templates")  # fmt: skip


def pytest_collection_modifyitems(items):
    rank = {group: n for n, group in enumerate(SLOWEST_FIRST)}
    items.sort(key=lambda item: rank.get(worker_group(item.nodeid), len(rank)))  # stable: files keep their order


def pytest_xdist_make_scheduler(config, log):
    """pytest-xdist's scheduler by scope, a scope being worker_group's. (Its own
    `--dist loadgroup` reads xdist_group marks by rewriting `item._nodeid`, which pytest 9
    no longer reads: until 2026-11-26 every test was scheduled alone, and files' module
    fixtures, and the session fixtures above, were made on both workers.)"""
    from xdist.scheduler import LoadScopeScheduling

    class FileGroups(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return worker_group(nodeid)

    config.option.loadscopereorder = False  # the collection's order: SLOWEST_FIRST's
    return FileGroups(config, log)


# A copy of the repository's packages, for the tests of code keys (an edit there must
# rerun exactly the stages whose imports reach it).
PACKAGES = tuple(tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"].values())


def copy_of_the_repository(copy: Path) -> Path:
    """The repository's packages, copied to edit without touching the real ones."""
    for package in PACKAGES:
        shutil.copytree(REPO / package, copy / package, ignore=shutil.ignore_patterns("__pycache__"))
    return copy


@pytest.fixture
def repo_copy(tmp_path_factory) -> Path:
    copy = copy_of_the_repository(tmp_path_factory.mktemp("repo"))
    yield copy
    code_parts.cache_clear()  # no key of the copy outlives the test


def edit(path: Path) -> None:
    """An edit of the file's code (a comment alone changes no key); the code keys forget
    what they had read."""
    path.write_text(path.read_text() + "\nEDITED = True  # an edit\n")
    code_parts.cache_clear()


@pytest.fixture(scope="session")
def never_interrupted(tmp_path_factory, worker_id) -> Path:
    """The workdir of test_crashes.reference_run (the tiny demo never interrupted), made once
    a session by whichever pytest worker asks first: test_crashes.py and test_stopping.py
    both compare with it, and only read it."""
    import fcntl

    root = tmp_path_factory.getbasetemp() if worker_id == "master" else tmp_path_factory.getbasetemp().parent
    done = root / "never-interrupted.done"
    with open(root / "never-interrupted.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # the other worker waits rather than making its own
        if not done.exists():
            import shutil

            shutil.rmtree(root / "never-interrupted", ignore_errors=True)
            from tests.test_crashes import reference_run

            reference_run(root / "never-interrupted")
            done.touch()
    return root / "never-interrupted"
