"""A training checkpoint is written on a thread of its own while the next epoch trains
(stages/shared/checkpoints.py): it holds the state of the epoch that ended, a stop waits
for it, and a failed write is raised in the stage."""

import threading
from types import SimpleNamespace

import pytest
import torch

from mule.stages.shared.checkpoints import Checkpoints, read_checkpoint


class Trainer:
    """What Checkpoints reads of a trainer: its state_dict, whose tensors training moves in place."""

    def __init__(self):
        self.weights = torch.zeros(3)
        self.epoch = 0

    def state_dict(self) -> dict:
        return {"model": {"w": self.weights}, "epoch": self.epoch, "best_state": None, "best_optimizer": None}


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


def test_a_failed_write_is_raised_by_the_next_save(tmp_path):
    (tmp_path / "not-a-folder").write_text("a file where the checkpoint's folder should be")
    checkpoints = Checkpoints(SimpleNamespace(key="k", after_record=[]), tmp_path / "not-a-folder" / "c.pt")
    checkpoints.save(Trainer())
    with pytest.raises(OSError):
        checkpoints.save(Trainer())
