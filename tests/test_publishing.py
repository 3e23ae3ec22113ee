"""A stage's result is recorded the moment its computation returns, before anything is
published: a stop while the train stage publishes (logging the pyfunc model and
registering it takes seconds) keeps the training, and the next run trains nothing,
publishes what the stopped run did not, and registers the model once."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from mule.pipeline.hooks import Publishing
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
    assert "and stopped before publishing it: publishing it now" in output
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


class _Stop(KeyboardInterrupt):
    """Ctrl-C at one point of the train publish."""


class _StoppingClient:
    """MLflow's client, stopped (Ctrl-C) just before its n-th write while `counting`."""

    def __init__(self, client, points: dict):
        self.client, self.points = client, points

    def __getattr__(self, name):
        attribute = getattr(self.client, name)
        if name.startswith(("get_", "search_", "list_", "download_")) or not callable(attribute):
            return attribute

        def write(*args, **kwargs):
            _point(self.points, name)
            return attribute(*args, **kwargs)

        return write


def _point(points: dict, name: str) -> None:
    if points["counting"]:
        points["seen"].append(name)
        if len(points["seen"]) == points["stop_before"]:
            raise _Stop()


def _registry(work: Path) -> list[tuple]:
    """The registry as a user sees it: per version, its weights, val mR, decision, champion or not."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{work / 'mlflow.db'}")
    champion = str(client.get_model_version_by_alias("mule-embedded", "champion").version)
    return sorted((int(v.version), v.tags["mule.model_identity"], v.tags["mule.val_mR"],
                   v.tags["mule.champion_decision"], str(v.version) == champion)
                  for v in client.search_model_versions("name = 'mule-embedded'"))  # fmt: skip


@pytest.mark.slow
def test_a_stop_anywhere_in_the_train_publish_then_another_setting_loses_no_model(tmp_path, never_interrupted,
                                                                                  monkeypatch):  # fmt: skip
    """The next run trains under another setting, so it would overwrite models/embedded/model.pt:
    first it publishes the model the stopped run kept, into that run (which ends FINISHED with
    its model.pt), and the registry equals that of the two runs never interrupted."""
    from mlflow.tracking import MlflowClient

    from mule.config.resolution import resolve
    from mule.experiments import relocation, tracking
    from mule.pipeline.hooks import tracked
    from mule.pipeline.runner import Runner
    from mule.serving import mlflow_model
    from mule.storage.workdir import Workdir
    from tests.test_crashes import TINY

    overrides = dict(o.split("=", 1) for o in TINY) | {"data.train_images": 32, "data.val_images": 16,
                                                        "data.test_images": 16}  # fmt: skip
    first, second = resolve("demo", overrides | {"train.lr": 0.01}), resolve("demo", overrides | {"train.lr": 0.002})
    points = {"counting": False, "seen": [], "stop_before": None}
    real_client, real_log_model = tracking.client, mlflow_model.log_model
    monkeypatch.setattr(tracking, "client", lambda wd: _StoppingClient(real_client(wd), points))

    def log_model(*args, **kwargs):
        _point(points, "log_model")
        return real_log_model(*args, **kwargs)

    monkeypatch.setattr(mlflow_model, "log_model", log_model)

    class CountPublishing(Publishing):
        def after_stage_run(self, run) -> None:
            points["counting"] = True
            try:
                super().after_stage_run(run)
            finally:
                points["counting"] = False

    def train(work: Path, cfg, stop_before: int | None = None) -> str | None:
        points.update(seen=[], stop_before=stop_before)
        hooks = [CountPublishing() if isinstance(h, Publishing) else h for h in tracked()]
        try:
            Runner(Workdir.at(work), hooks).run(cfg, "train")
        except _Stop:
            return json.loads((work / "state/stages/embedded/train.json").read_text())["run_id"]
        return None

    def copy(name: str) -> Path:
        work = tmp_path / name
        shutil.copytree(never_interrupted, work)
        relocation.adopt(Workdir.at(work))
        return work

    reference = copy("never-stopped")
    train(reference, first)
    writes = list(points["seen"])  # every write of the first model's publish, in order
    train(reference, second)
    expected = _registry(reference)
    assert len(expected) == 3 and len({v[1] for v in expected}) == 3, expected  # the demo's, then two others
    assert writes.count("log_model") == 1 and "create_model_version" in writes and len(writes) >= 8, writes
    for stop_before in range(1, len(writes) + 1):
        work = copy(f"stopped-before-{stop_before}")
        stopped = train(work, first, stop_before)
        assert stopped, f"no stop before write {stop_before} ({writes[stop_before - 1]})"
        train(work, second)
        assert _registry(work) == expected, f"stopped before write {stop_before}: {writes[stop_before - 1]}"
        run = MlflowClient(f"sqlite:///{work / 'mlflow.db'}").get_run(stopped)
        assert run.info.status == "FINISHED" and run.data.tags["mule.published_by_run"], stop_before
        assert "model.pt" in {a.path for a in MlflowClient(f"sqlite:///{work / 'mlflow.db'}").list_artifacts(stopped)}
        shutil.rmtree(work)  # 26 workdirs of 40 MB each otherwise stay until the test ends
