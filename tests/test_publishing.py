"""A stage's result is recorded the moment its computation returns, before anything is
published: a stop while the train stage publishes (logging the pyfunc model and
registering it takes seconds) keeps the training, and the next run trains nothing,
publishes what the stopped run did not, and registers the model once."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.test_crashes import SIZES, TINY

REPO = Path(__file__).resolve().parents[1]
# `mule` as a user runs it, whose train publisher is interrupted by Ctrl-C the moment it starts
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


def _mule(args: list[str], env: dict, script: str | None = None) -> subprocess.CompletedProcess:
    command = [sys.executable, "-c", script, *args] if script else [sys.executable, "-m", "mule.commands", *args]
    return subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)


@pytest.mark.slow
def test_a_stop_while_train_publishes_keeps_the_training_and_the_next_run_registers_it_once(tmp_path,
                                                                                          prefect_api_url):  # fmt: skip
    from mlflow.tracking import MlflowClient

    work = tmp_path / "work"
    args = ["demo", "--workdir", str(work), *SIZES, *[a for o in TINY for a in ("--set", o)]]
    env = {**os.environ, "PREFECT_API_URL": prefect_api_url, "MULE_PREFECT_HEARTBEATS": "off"}
    stopped = _mule(args, env, CTRL_C_WHILE_TRAIN_PUBLISHES)
    said = [line for line in (stopped.stdout + stopped.stderr).splitlines() if line.startswith("mule: stopped")]
    assert stopped.returncode == 130, (stopped.stdout + stopped.stderr)[-3000:]
    assert said and "in stage train" in said[-1], said
    assert "train: computed and recorded, not yet published (the next run publishes it)" in said[-1]
    record = json.loads((work / "state" / "stages" / "embedded" / "train.json").read_text())
    assert record["published"] is False and (work / "models" / "embedded" / "model.pt").exists()
    assert not (work / "models" / "embedded" / "model-checkpoint.pt").exists()  # the record holds the result now

    again = _mule(args, env)
    output = again.stdout + again.stderr
    assert again.returncode == 0, output[-3000:]
    assert "train      reused" in output and "joint epoch" not in output  # nothing trained again
    assert "stopped before publishing it: publishing it now" in output
    client = MlflowClient(f"sqlite:///{work / 'mlflow.db'}")
    versions = client.search_model_versions("name = 'mule-embedded'")
    assert [str(v.version) for v in versions] == ["1"]
    assert str(client.get_model_version_by_alias("mule-embedded", "champion").version) == "1"
    assert versions[0].tags["mule.test_2016.mR"]  # the evaluate stage found it and tagged it
    assert json.loads((work / "state" / "stages" / "embedded" / "train.json").read_text())["published"] is True

    third = _mule(args, env)  # nothing left to publish: nothing more registered
    assert third.returncode == 0 and "every stage is up to date" in third.stdout + third.stderr
    assert len(client.search_model_versions("name = 'mule-embedded'")) == 1
