"""A stage's result is recorded the moment its computation returns, before anything is
published: a stop while the train stage publishes (logging the pyfunc model and
registering it takes seconds) keeps the training, and the next run trains nothing,
publishes what the stopped run did not, and registers the model once."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.test_crashes import SIZES, TINY

# `mule`'s entry point (forked: tests/forked.py), whose train publisher is interrupted by Ctrl-C the moment it starts
CTRL_C_WHILE_TRAIN_PUBLISHES = r"""
import os, signal, sys
import mule.pipeline.publish as publish
real = publish.train
def train(*args, **kwargs):
    os.kill(os.getpid(), signal.SIGINT)
    return real(*args, **kwargs)
publish.train = train
from mule.commands.main import entry
sys.argv = ["mule", *sys.argv[1:]]
entry()
"""


def _mule(args: list[str], forker, log: Path, script: str | None = None) -> tuple[int, str]:
    """(exit code, output) of the command forked from a process that has imported mule."""
    done = forker.run(args, log, script=script)
    return done.returncode, done.output()


@pytest.mark.slow
def test_a_stop_while_train_publishes_keeps_the_training_and_the_next_run_registers_it_once(tmp_path,
                                                                                          forker):  # fmt: skip
    from mlflow.tracking import MlflowClient

    work = tmp_path / "work"
    args = ["demo", "--workdir", str(work), *SIZES, *[a for o in TINY for a in ("--set", o)]]
    code, output = _mule(args, forker, tmp_path / "stopped.log", CTRL_C_WHILE_TRAIN_PUBLISHES)
    said = [line for line in output.splitlines() if line.startswith("mule: stopped")]
    assert code == 130, output[-3000:]
    assert said and "in stage train" in said[-1], said
    assert "train: computed and recorded, not yet published (the next run publishes it)" in said[-1]
    assert "checkpoint" not in said[-1] and " train (finished)" not in said[-1]  # what it kept, as it is
    record = json.loads((work / "state" / "stages" / "embedded" / "train.json").read_text())
    assert record["published"] is False and (work / "models" / "embedded" / "model.pt").exists()
    assert not (work / "models" / "embedded" / "model-checkpoint.pt").exists()  # the record holds the result now

    code, output = _mule(args, forker, tmp_path / "again.log")
    assert code == 0, output[-3000:]
    assert "train      reused" in output and "joint epoch" not in output  # nothing trained again
    assert "stopped before publishing it: publishing it now" in output
    assert "train      reused (key " in output and "published now: the run that computed it stopped" in output
    client = MlflowClient(f"sqlite:///{work / 'mlflow.db'}")
    versions = client.search_model_versions("name = 'mule-embedded'")
    assert [str(v.version) for v in versions] == ["1"]
    assert str(client.get_model_version_by_alias("mule-embedded", "champion").version) == "1"
    assert versions[0].tags["mule.test_2016.mR"]  # the evaluate stage found it and tagged it
    assert json.loads((work / "state" / "stages" / "embedded" / "train.json").read_text())["published"] is True

    code, output = _mule(args, forker, tmp_path / "third.log")  # nothing left to publish: nothing more registered
    assert code == 0 and "every stage is up to date" in output
    assert len(client.search_model_versions("name = 'mule-embedded'")) == 1
