"""Stages side by side (pipeline.lanes): a stage whose inputs are written runs beside the
stage in hand, on its share of the cores; errors and stops behave as one stage at a time."""

import signal
import threading
import time
import weakref

import pytest

from mule.config.resolution import resolve
from mule.mule_core import devices
from mule.mule_core.progress import lane_of
from mule.pipeline import lanes
from mule.pipeline.declaration import REBUILD
from mule.storage import locks
from mule.storage.workdir import Workdir


def test_each_stage_needs_the_stages_that_write_what_it_reads():
    needs = lanes.needs(list(REBUILD), resolve("demo", {}))
    assert needs["features"] == {"ingest"}  # not translate, text or LP: it runs beside them
    assert needs["text"] == {"ingest"}  # human captions only: the translations are not its business
    with_mt = lanes.needs(list(REBUILD), resolve("demo", {"data.captions": "human+mt"}))
    assert with_mt["text"] == {"ingest", "translate"} and with_mt["pretrain"] >= {"translate", "text"}
    assert needs["train"] >= {"features", "pretrain", "text"}
    assert needs["index"] >= {"train", "features"} and "evaluate" not in needs["index"]


class Recorder:
    """A run_one that records when each stage starts and ends, on which thread, with which
    share of the cores; `hold` names stages that wait until released."""

    def __init__(self, hold=(), fail=()):
        self.events, self.lock = [], threading.Lock()
        self.gates = {s: threading.Event() for s in hold}
        self.fail = set(fail)
        self.cores, self.threads, self.lanes = {}, {}, {}

    def __call__(self, stage: str) -> None:
        with self.lock:
            self.events.append(("start", stage))
        self.cores[stage] = devices.usable_cores()
        self.threads[stage] = threading.current_thread() is threading.main_thread()
        self.lanes[stage] = lane_of()
        if stage in self.gates:
            assert self.gates[stage].wait(10), stage
        if stage in self.fail:
            raise RuntimeError(f"{stage} failed")
        with self.lock:
            self.events.append(("end", stage))

    def started(self, stage: str) -> bool:
        return ("start", stage) in self.events

    def index(self, event: str, stage: str) -> int:
        return self.events.index((event, stage))


def released_when(recorder: Recorder, stage: str, condition) -> threading.Thread:
    def release() -> None:
        deadline = time.monotonic() + 10
        while not condition() and time.monotonic() < deadline:
            time.sleep(0.01)
        recorder.gates[stage].set()

    thread = threading.Thread(target=release, daemon=True)
    thread.start()
    return thread


@pytest.fixture
def two_cores(monkeypatch):
    monkeypatch.setattr(devices, "machine_cores", lambda: 2)


def test_features_runs_beside_the_text_stages_on_one_of_two_cores(two_cores):
    """features starts with translate and holds until LP has started: the main lane went on
    without it; train waits for both; index runs beside evaluate."""
    recorder = Recorder(hold=["features"])
    released_when(recorder, "features", lambda: recorder.started("pretrain"))
    lanes.run_stages(list(REBUILD), resolve("demo", {}), recorder)
    assert sorted(s for e, s in recorder.events if e == "end") == sorted(REBUILD)
    assert recorder.index("start", "features") < recorder.index("end", "translate")
    assert recorder.index("start", "pretrain") < recorder.index("end", "features")
    assert recorder.index("start", "train") > max(recorder.index("end", "features"), recorder.index("end", "pretrain"))
    assert not recorder.threads["features"] and recorder.threads["pretrain"] and recorder.threads["train"]
    assert recorder.cores["features"] == 1 and recorder.cores["translate"] == 1  # one core each while both run
    assert recorder.cores["train"] == 2  # alone again: every core
    assert recorder.lanes["features"] == "features" and recorder.lanes["translate"] == "translate"
    assert recorder.lanes["train"] is None  # one stage at a time: its lines need no name
    assert not recorder.threads["index"] and recorder.threads["evaluate"]  # index beside evaluate
    assert devices.usable_cores() == 2  # the shares end with the run


def test_sequential_runs_one_stage_at_a_time_in_order(two_cores):
    recorder = Recorder()
    lanes.run_stages(list(REBUILD), resolve("demo", {}), recorder, sequential=True)
    assert recorder.events == [(e, s) for s in REBUILD for e in ("start", "end")]
    assert all(recorder.threads.values())


def test_one_core_runs_one_stage_at_a_time(monkeypatch):
    monkeypatch.setattr(devices, "machine_cores", lambda: 1)
    recorder = Recorder()
    lanes.run_stages(list(REBUILD), resolve("demo", {}), recorder)
    assert recorder.events == [(e, s) for s in REBUILD for e in ("start", "end")]


def test_a_waiting_main_lane_gives_the_side_lane_every_core(two_cores):
    """LP is done and train needs features: the main lane waits, and features' next shard may use both cores."""
    seen = {}
    recorder = Recorder(hold=["features"])

    def later_shard() -> bool:
        if recorder.started("pretrain") and ("end", "pretrain") in recorder.events:
            time.sleep(0.2)  # the main lane reaches its wait
            return True
        return False

    original = recorder.__call__

    def run_one(stage: str) -> None:
        original(stage)
        if stage == "features":
            seen["after"] = devices.usable_cores()

    released_when(recorder, "features", later_shard)
    lanes.run_stages(list(REBUILD), resolve("demo", {}), run_one)
    assert recorder.cores["features"] == 1 and seen["after"] == 2


def test_an_error_beside_the_stage_in_hand_fails_the_run_once_that_stage_is_done(two_cores):
    recorder = Recorder(hold=["features"], fail=["features"])
    released_when(recorder, "features", lambda: recorder.started("text"))
    with pytest.raises(RuntimeError, match="features failed"):
        lanes.run_stages(list(REBUILD), resolve("demo", {}), recorder)
    ended = [s for e, s in recorder.events if e == "end"]
    assert "text" in ended and not recorder.started("train")  # text finished; nothing after it started


def test_an_error_in_the_main_lane_lets_the_side_lane_finish_its_stage(two_cores):
    recorder = Recorder(hold=["features"], fail=["translate"])
    released_when(recorder, "features", lambda: True)
    with pytest.raises(RuntimeError, match="translate failed"):
        lanes.run_stages(list(REBUILD), resolve("demo", {}), recorder)
    assert ("end", "features") in recorder.events and not recorder.started("text")


def test_two_stages_each_end_their_own_commit(tmp_path):
    """Readers wait while either stage writes, and read again once neither does."""
    wd = Workdir.at(tmp_path)
    lock = wd.catalog_lock_path
    ended = threading.Event()

    def side() -> None:
        locks.set_lane("features")
        locks.committing(wd)
        ended.wait(5)
        locks.end_commit(wd)
        locks.set_lane(None)

    thread = threading.Thread(target=side)
    locks.committing(wd)  # the main lane writes
    thread.start()
    time.sleep(0.1)
    locks.end_commit(wd)  # the main lane is recorded; features still writes
    assert str(lock) in locks._commits
    ended.set()
    thread.join(5)
    assert str(lock) not in locks._commits


def test_a_stop_in_the_main_lane_stops_the_side_lane_too(two_cores):
    """Ctrl-C raises in the main thread only: the side lane is stopped the same way, at its
    next line of Python, and the run raises the stop."""
    side_stopped = threading.Event()
    features_running = threading.Event()

    def run_one(stage: str) -> None:
        if stage == "features":
            features_running.set()
            try:
                while True:
                    time.sleep(0.01)
            except KeyboardInterrupt:
                side_stopped.set()
                raise
        if stage == "translate":
            assert features_running.wait(5)
            raise KeyboardInterrupt("SIGINT")

    started = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        lanes.run_stages(list(REBUILD), resolve("demo", {}), run_one)
    assert side_stopped.wait(2) and time.monotonic() - started < 3


@pytest.mark.parametrize("raised", ["TerminationSignal", "an error while stopping"])
def test_what_the_main_lane_raises_while_a_signal_stops_the_process_stops_the_side_lane(two_cores, monkeypatch,
                                                                                          raised):  # fmt: skip
    """While a flow runs, SIGTERM raises Prefect's TerminationSignal (not a KeyboardInterrupt),
    and a signal can surface as another error (a query interrupted): the side lane is stopped
    with the signal's Interrupted, not left to finish its stage as after a failure (the
    watchdog then ended the process after its grace: a stop in translate took 2.3 s)."""
    from prefect.exceptions import TerminationSignal

    from mule.process import interrupts

    side_stopped: list[BaseException] = []
    features_running = threading.Event()

    def run_one(stage: str) -> None:
        if stage == "features":
            features_running.set()
            try:
                deadline = time.monotonic() + 10
                while time.monotonic() < deadline:
                    time.sleep(0.01)
            except KeyboardInterrupt as stop:
                side_stopped.append(stop)
                raise
        if stage == "translate":
            assert features_running.wait(5)
            if raised == "TerminationSignal":
                raise TerminationSignal(signal=signal.SIGTERM)
            monkeypatch.setattr(interrupts._state, "armed", signal.SIGTERM)  # the watchdog knows of the signal
            raise RuntimeError("Query interrupted")

    with pytest.raises((TerminationSignal, RuntimeError)):
        lanes.run_stages(list(REBUILD), resolve("demo", {}), run_one)
    deadline = time.monotonic() + 2
    while not side_stopped and time.monotonic() < deadline:
        time.sleep(0.01)
    assert side_stopped, "the side lane was left to finish its stage"
    assert isinstance(side_stopped[0], interrupts.Interrupted) and side_stopped[0].signum == signal.SIGTERM


def test_a_stopped_side_lane_lets_go_of_what_its_frames_held(two_cores):
    """The side lane's stop keeps its traceback, and the traceback its frames' locals: an
    MLflow write stopped inside its SQLite transaction kept the database's lock, and the
    main lane, ending its own MLflow run, waited on it until the watchdog (3.8 s)."""

    class Held:  # what a frame holds: a connection, in the run above
        pass

    held: list[weakref.ref] = []
    features_running = threading.Event()

    def run_one(stage: str) -> None:
        if stage == "features":
            connection = Held()
            held.append(weakref.ref(connection))
            features_running.set()
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                time.sleep(0.01)
        if stage == "translate":
            assert features_running.wait(5)
            raise KeyboardInterrupt("SIGINT")

    with pytest.raises(KeyboardInterrupt) as stop:
        lanes.run_stages(list(REBUILD), resolve("demo", {}), run_one)
    assert stop.value is not None and held[0]() is None


def test_a_failure_in_the_main_lane_is_not_taken_for_a_stop(two_cores):
    assert lanes._stop_in(RuntimeError("translate failed")) is None
    assert lanes._stop_in(KeyboardInterrupt()) is KeyboardInterrupt


def test_the_stage_in_hand_gets_every_core_once_the_stage_beside_it_ends(two_cores):
    """The text stage starts beside features on one core; once features ends, its next
    fastText job may use the other (devices.cores_of: what its job pool asks)."""
    seen = {}
    recorder = Recorder(hold=["text", "features"])
    released_when(recorder, "features", lambda: "at start" in seen)

    def run_one(stage: str) -> None:
        if stage == "text":
            seen["at start"] = devices.usable_cores()
            main = threading.get_ident()
            deadline = time.monotonic() + 5
            while ("end", "features") not in recorder.events and time.monotonic() < deadline:
                time.sleep(0.01)
            time.sleep(0.05)  # the side lane lets go of its share right after it records its end
            seen["after features"] = devices.cores_of(main)
            recorder.gates["text"].set()
        recorder(stage)

    lanes.run_stages(list(REBUILD), resolve("demo", {}), run_one)
    assert seen == {"at start": 1, "after features": 2}


HALF_IMPORTED = r"""
import importlib.abc, importlib.machinery, sys, threading, time, types

started, release = threading.Event(), threading.Event()


class SlowTorch(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    '''A torch whose import takes a while: in sys.modules, half made (no get_num_threads
    yet), until `release`, as the real one is for seconds while the other lane imports it.'''

    def find_spec(self, name, path=None, target=None):
        return importlib.machinery.ModuleSpec("torch", self) if name == "torch" else None

    def create_module(self, spec):
        return None

    def exec_module(self, module):
        threading.Timer(0.5, release.set).start()  # the import takes half a second
        started.set()
        release.wait(10)
        threads = [2]
        module.get_num_threads = lambda: threads[0]
        module.set_num_threads = lambda n: threads.__setitem__(0, n)


sys.meta_path.insert(0, SlowTorch())
from mule.mule_core import devices
from mule.pipeline import lanes

devices.machine_cores = lambda: 2


def run_one(stage):
    if stage == "beside":  # the side lane imports torch
        import torch
    elif stage == "first":  # the main lane's first stage ends once the side lane is inside the import
        assert started.wait(10)


lanes.Lanes(["first", "beside", "second"], {"first": set(), "beside": set(), "second": {"first"}}, run_one).run()
import torch

print("threads after the run:", torch.get_num_threads())
"""


def test_a_stage_starting_while_the_other_lane_imports_torch_waits_for_the_import():
    """The main lane's next stage starts while the side lane is inside `import torch`: the
    lane machinery reads torch's thread count once the import is done. It read
    sys.modules["torch"] as it was then, half made, and failed the run with AttributeError:
    partially initialized module 'torch' has no attribute 'get_num_threads' (2 tries in 9
    of `mule demo --force features`). A fresh process, where torch is not yet imported."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", HALF_IMPORTED], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "threads after the run: 2" in done.stdout  # the main lane's count, put back after it was shared


def test_the_stage_named_as_failed_is_the_main_lane_s_not_the_last_to_take_the_lock(two_cores, tmp_path, caplog):
    """The main lane's stage fails while the stage beside it holds the workdir's lock last:
    the warning names the main lane's stage (it named the last stage to take the lock,
    process-wide: 'features failed; features, beside it, finishes first')."""
    wd = Workdir.at(tmp_path)
    beside_locked = threading.Event()

    def run_one(stage: str) -> None:
        with locks.workdir_lock(wd, stage):
            if stage == "features":
                beside_locked.set()
                time.sleep(0.2)
            else:
                assert beside_locked.wait(10)
                raise RuntimeError(f"{stage} failed")

    with locks.workdir_lock(wd, "rebuild"), caplog.at_level("WARNING", logger="mule.pipeline"):
        with pytest.raises(RuntimeError, match="translate failed"):
            lanes.Lanes(["translate", "features"], {"translate": set(), "features": set()}, run_one).run()
    warned = [r.getMessage() for r in caplog.records if "beside it, finishes first" in r.getMessage()]
    assert warned == ["translate failed; features, beside it, finishes first (Ctrl-C stops it)"]
