"""A training checkpoint is written on a thread of its own while the next epoch trains
(tasks/shared/checkpoints.py): it holds the state of the epoch that ended, a stop waits
for it, a failed write is raised in the stage; the writer takes the cycles training leaves
idle, and where it cannot, long writes are spaced out."""

import os
import sys
import threading
from types import SimpleNamespace

import pytest
import torch

from mule.tasks.shared.checkpoints import Checkpoints, read_checkpoint


class Trainer:
    """What Checkpoints reads of a trainer: its state_dict, whose tensors training moves in place."""

    def __init__(self, epochs: int = 10):
        self.weights = torch.zeros(3)
        self.epoch, self.epochs, self.stopped = 0, epochs, None

    @property
    def finished(self) -> bool:
        return self.epoch >= self.epochs or self.stopped is not None

    def state_dict(self) -> dict:
        return {"model": {"w": self.weights}, "epoch": self.epoch, "best": {"state": None, "optimizer": None}}


def held_writes(monkeypatch) -> threading.Event:
    """save_atomic waits until the returned event is set: the write is still going on."""
    from mule.data_catalog import model_files

    release, original = threading.Event(), model_files.save_atomic

    def slow(obj, path):
        release.wait(10)
        original(obj, path)

    monkeypatch.setattr(model_files, "save_atomic", slow)  # Checkpoints.save imports it at each call
    return release


def test_the_checkpoint_holds_the_epoch_that_ended_while_the_next_one_moves_the_weights(tmp_path, monkeypatch):
    release = held_writes(monkeypatch)
    checkpoints = Checkpoints(SimpleNamespace(key="k", after_record=[]), tmp_path / "c.pt")
    trainer = Trainer()
    trainer.weights += 1.0
    trainer.epoch = 1
    checkpoints.save(trainer)  # returns while the write waits
    assert not (tmp_path / "c.pt").exists()
    trainer.weights += 5.0  # the next epoch trains meanwhile
    trainer.epoch = 2
    release.set()
    checkpoints.wait()
    state = read_checkpoint(tmp_path / "c.pt")
    assert state["trainer"]["epoch"] == 1 and torch.equal(state["trainer"]["model"]["w"], torch.ones(3))


def test_a_stop_during_the_next_epoch_keeps_the_checkpoint_being_written(tmp_path, monkeypatch):
    release = held_writes(monkeypatch)
    checkpoints = Checkpoints(SimpleNamespace(key="k", after_record=[]), tmp_path / "c.pt")
    trainer = Trainer()
    trainer.epoch = 1
    checkpoints.save(trainer)
    threading.Timer(0.2, release.set).start()  # the write ends after the stop
    with pytest.raises(KeyboardInterrupt), checkpoints.training():
        raise KeyboardInterrupt
    assert read_checkpoint(tmp_path / "c.pt")["trainer"]["epoch"] == 1


def test_a_failed_write_is_raised_in_the_stage(tmp_path):
    (tmp_path / "not-a-folder").write_text("a file where the checkpoint's folder should be")
    checkpoints = Checkpoints(SimpleNamespace(key="k", after_record=[]), tmp_path / "not-a-folder" / "c.pt")
    checkpoints.save(Trainer())
    with pytest.raises(OSError), checkpoints.training():
        pass  # training ended: the write in flight is waited for, and its error raised


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.mark.skipif(sys.platform != "linux", reason="a thread's own priority is Linux's")
def test_a_large_checkpoint_s_writer_runs_at_the_lowest_priority_and_training_keeps_its_own(tmp_path, monkeypatch):
    from mule.data_catalog import model_files

    seen = {}
    original = model_files.save_atomic

    def spy(obj, path):
        seen["writer"] = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
        original(obj, path)

    monkeypatch.setattr(model_files, "save_atomic", spy)
    before = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    checkpoints = Checkpoints(SimpleNamespace(key="k", after_record=[]), tmp_path / "c.pt")
    checkpoints.save(Trainer())  # 12 bytes: the stage's own priority
    checkpoints.wait()
    assert seen["writer"] == before
    monkeypatch.setattr(Checkpoints, "YIELD_BYTES", 12)  # as large as the real text's 1.3 GB, for this test
    checkpoints.save(Trainer())
    checkpoints.wait()
    assert seen["writer"] == 19 and os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) == before
    assert os.getpriority(os.PRIO_PROCESS, os.getpid()) == before  # the thread alone, not the process


def test_a_yielding_writer_checkpoints_every_epoch_that_ends_after_the_last_write(tmp_path, monkeypatch):
    """The writer takes idle cycles: no spacing. Epochs of 3 s; writes of 0.5 s, then 5 s
    from epoch 3 on: the epochs that end while a write is in flight write none; the last
    writes none."""
    from mule.tasks.shared import checkpoints as module

    monkeypatch.setattr(module, "yield_cpu", lambda: True)
    monkeypatch.setattr(Checkpoints, "YIELD_BYTES", 0)  # every checkpoint a large one
    clock = Clock()
    monkeypatch.setattr(module, "monotonic", clock)
    release = held_writes(monkeypatch)  # a write goes on until the clock passes its end
    checkpoints = Checkpoints(SimpleNamespace(key="k", after_record=[]), tmp_path / "c.pt")
    trainer = Trainer(epochs=9)
    written, ends = [], None
    for epoch in range(1, 10):
        clock.now += 3.0  # the epoch trains
        if ends is not None and clock.now >= ends:
            release.set()
            checkpoints._writer.join()
            release.clear()
            ends = None
        trainer.epoch = epoch
        writer = checkpoints._writer
        checkpoints.save(trainer)
        if checkpoints._writer is not writer:
            written.append(epoch)
            ends = clock.now + (5.0 if epoch >= 3 else 0.5)
    release.set()
    checkpoints.wait()
    assert written == [1, 2, 3, 5, 7]
    assert read_checkpoint(tmp_path / "c.pt")["trainer"]["epoch"] == 7


def test_long_writes_come_no_more_often_than_five_times_their_duration(tmp_path, monkeypatch):
    """Where the writer cannot yield (not Linux): writes under a second come after every
    epoch; a 2 s write is followed by none until 10 s after it began (the writes' share of
    the time at most a fifth); the last epoch writes none (the stage saves its model next)."""
    from mule.data_catalog import model_files
    from mule.tasks.shared import checkpoints as module

    monkeypatch.setattr(module, "yield_cpu", lambda: False)
    clock = Clock()
    monkeypatch.setattr(module, "monotonic", clock)
    duration = {"s": 0.5}

    def timed(obj, path):
        clock.now += duration["s"]
        model_files.torch.save(obj, path)

    monkeypatch.setattr(model_files, "save_atomic", timed)
    checkpoints = Checkpoints(SimpleNamespace(key="k", after_record=[]), tmp_path / "c.pt")
    trainer = Trainer(epochs=9)
    written = []
    for epoch in range(1, 10):
        trainer.epoch = epoch
        if epoch == 3:
            duration["s"] = 2.0  # the tables grew: writes take 2 s from here on
        checkpoints.save(trainer)
        checkpoints.wait()
        if read_checkpoint(tmp_path / "c.pt")["trainer"]["epoch"] == epoch:
            written.append(epoch)
        clock.now += 3.0  # the next epoch trains for 3 s
    # 1, 2 (0.5 s each), 3 (2 s, began at t); epochs 4-6 end at t + 5, t + 8, t + 11: 6 is due;
    # then 7 and 8 at 5 and 8 s after 6's write began; 9 is the last
    assert written == [1, 2, 3, 6]
