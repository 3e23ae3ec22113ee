"""The champion alias moves only on improvement, among comparable models, and is a fact
after any stop in publishing (real MLflow, SQLite in a temp dir)."""

import pytest

from mule.experiments import registry, tracking
from mule.storage.workdir import Workdir


def test_the_champion_moves_only_when_a_comparable_model_is_better_and_test_results_are_tagged(tmp_path):
    wd = Workdir.at(tmp_path)
    client = tracking.client(wd)
    experiment = tracking.experiment_id(wd, "toy")

    def candidate(val_mr: float, val_images: list[str], languages=("en", "de"), split="test") -> registry.Candidate:
        run = client.create_run(experiment).info.run_id
        client.log_text(run, "weights", "model/weights.txt")
        return registry.Candidate("toy", run, f"runs:/{run}/model", val_mr, languages,
                                  registry.split_digest(val_images), split)  # fmt: skip

    val = ["img-3", "img-1", "img-2"]
    decisions = [
        registry.register(wd, candidate(50.0, val)),  # v1: the first is champion
        registry.register(wd, candidate(40.0, val)),  # v2: worse, stays behind
        registry.register(wd, candidate(60.0, list(reversed(val)))),  # v3: better (same images, any order)
        registry.register(wd, candidate(70.0, ["img-9"])),  # v4: other validation images: not comparable
        registry.register(wd, candidate(75.0, val, ("en",))),  # v5: other languages: not comparable
        registry.register(wd, candidate(60.0, val)),  # v6: a tie does not beat
        # v7: evaluated on another split (eval.split=test_2017): validation is what is compared
        registry.register(wd, candidate(65.0, val, split="test_2017")),
    ]
    assert [d["version"] for d in decisions] == [1, 2, 3, 4, 5, 6, 7]
    assert [d["champion"] for d in decisions] == [True, False, True, False, False, False, True]
    assert client.get_model_version_by_alias("mule-toy", "champion").version == 7
    assert decisions[0]["why"] == "first model of this dataset"
    assert decisions[2]["why"] == "val mR 60.00 beats champion v1 (50.00)"
    assert decisions[3]["why"].startswith("not comparable with champion v3")
    assert decisions[4]["why"].startswith("not comparable with champion v3")
    assert decisions[5]["why"] == "val mR 60.00 does not beat champion v3 (60.00)"
    version = client.get_model_version("mule-toy", "2")
    assert version.tags["mule.val_mR"] == "40.0000" and version.tags["mule.languages"] == "en,de"
    assert version.tags["mule.champion_decision"] == decisions[1]["why"]

    # The evaluate stage adds the mR of the split it measured to the version its model's train run registered.
    table = {"en": {"mR": 41.25}}
    run = client.get_model_version("mule-toy", "5").run_id
    assert registry.tag_test_results(wd, "toy", {"run_id": run}, "test_2016", 41.25, table) == 5
    tags = client.get_model_version("mule-toy", "5").tags
    assert tags["mule.test_2016.mR"] == "41.2500" and tags["mule.test_2016.mR.en"] == "41.2500"
    assert registry.tag_test_results(wd, "toy", {"run_id": "no-such-run"}, "test_2016", 41.25, table) is None


def test_a_trained_model_is_registered_once_whoever_publishes_it(tmp_path):
    """The train publisher asks first whether its model (train key and weights' digest) is
    registered already: a run stopped after registering, before its record said so, leaves
    one version, not two, when the next run publishes."""
    wd = Workdir.at(tmp_path)
    client = tracking.client(wd)
    experiment = tracking.experiment_id(wd, "toy")
    record = {"key": "k1", "outputs": {"models/toy/model.pt": "abc"}}
    identity = registry.model_identity(record)
    assert identity != registry.model_identity({**record, "outputs": {"models/toy/model.pt": "other weights"}})
    assert registry.registered_for(wd, "toy", identity) is None
    run = client.create_run(experiment).info.run_id
    first = registry.register(wd, registry.Candidate("toy", run, f"runs:/{run}/model", 50.0, ("en",),
                                                     registry.split_digest(["a"]), "test", identity))  # fmt: skip
    again = registry.registered_for(wd, "toy", identity)
    assert again["version"] == first["version"] == 1 and again["champion"] is True
    later = client.create_run(experiment).info.run_id  # the run that published it after the stop
    assert registry.tag_test_results(wd, "toy", {**record, "run_id": later}, "test_2016", 41.0, {"en": {"mR": 41.0}}) == 1


def test_mlflow_checks_a_model_s_requirements_with_mule_s_cached_package_map():
    """Logging or loading a model, MLflow maps every installed module to its distribution
    (1.4-2 s of RECORD files per process); it gets mule's cached map instead, and still
    warns about a requirement the environment does not meet. In a fresh process, where
    MLflow has built no map yet; reading RECORD files there would raise."""
    import subprocess
    import sys

    script = """
import importlib_metadata, logging, sys
def no(*args, **kwargs):
    raise AssertionError("MLflow read every RECORD file")
importlib_metadata.packages_distributions = no
from mlflow.utils import requirements_utils
from mule.experiments.tracking import mlflow_knows_installed_packages
mlflow_knows_installed_packages()
assert requirements_utils.importlib_metadata is importlib_metadata  # put back
assert requirements_utils._MODULES_TO_PACKAGES["duckdb"] == ["duckdb"]
seen = []
logging.getLogger("mlflow.utils.requirements_utils").addHandler(logging.Handler())
logging.Handler.emit = lambda self, record: seen.append(record.getMessage())
requirements_utils.warn_dependency_requirement_mismatches(["duckdb==0.0.1", "numpy"])
print(seen)
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    warning = done.stdout
    assert "duckdb (current: " in warning and "required: duckdb==0.0.1" in warning and "numpy" not in warning


class Stopped(KeyboardInterrupt):
    """A Ctrl-C between two of the registry's writes."""


class StoppingClient:
    """MLflow's client, stopped (Ctrl-C) just before its n-th write; counts the writes."""

    WRITES = ("create_registered_model", "create_model_version", "set_registered_model_alias", "set_model_version_tag")

    def __init__(self, client, stop_before: int | None):
        self.client, self.stop_before, self.writes = client, stop_before, 0

    def __getattr__(self, name):
        attribute = getattr(self.client, name)
        if name not in self.WRITES:
            return attribute

        def write(*args, **kwargs):
            self.writes += 1
            if self.writes == self.stop_before:
                raise Stopped()
            return attribute(*args, **kwargs)

        return write


def _state(wd: Workdir) -> list[tuple]:
    """The registry as a user sees it: each version, its decision, whether it is champion."""
    client = tracking.client(wd)
    champion = client.get_model_version_by_alias("mule-toy", "champion").version
    return sorted((int(v.version), v.tags.get("mule.val_mR"), v.tags.get("mule.champion_decision"), v.version == champion)
                  for v in client.search_model_versions("name = 'mule-toy'"))  # fmt: skip


@pytest.mark.parametrize("history", [(), (50.0,), (70.0,)], ids=["first model", "a better one", "a worse one"])
def test_the_champion_is_a_fact_after_a_stop_between_any_two_registry_writes(tmp_path, monkeypatch, history):
    """Publishing a model stopped before each of its registry writes in turn; the next run
    publishes the same model again (registered_for, then register when nothing was
    registered), as the train publisher does. The registry then holds what an
    uninterrupted run leaves: one version per model, the same decisions, the same champion."""
    real_client = tracking.client

    def publish(wd: Workdir, val_mr: float, identity: str, stop_before: int | None = None) -> int:
        client = StoppingClient(real_client(wd), stop_before)
        monkeypatch.setattr(tracking, "client", lambda _wd: client)
        try:
            if registry.registered_for(wd, "toy", identity) is None:
                run = client.create_run(tracking.experiment_id(wd, "toy")).info.run_id
                registry.register(wd, registry.Candidate("toy", run, f"runs:/{run}/model", val_mr, ("en",),
                                                         registry.split_digest(["a"]), "test", identity))  # fmt: skip
        finally:
            monkeypatch.setattr(tracking, "client", real_client)
        return client.writes

    def earlier(wd: Workdir) -> None:
        for n, val_mr in enumerate(history):
            publish(wd, val_mr, f"earlier-{n}")

    reference = Workdir.at(tmp_path / "reference")
    earlier(reference)
    writes = publish(reference, 60.0, "new")
    assert writes >= 4 - (1 if history else 0)  # the version, its decision, the alias (or not), settled
    expected = _state(reference)
    for stop_before in range(1, writes + 1):
        wd = Workdir.at(tmp_path / f"stopped-before-write-{stop_before}")
        earlier(wd)
        with pytest.raises(Stopped):
            publish(wd, 60.0, "new", stop_before)
        publish(wd, 60.0, "new")  # the next run
        assert _state(wd) == expected, f"stopped before write {stop_before}"
        publish(wd, 60.0, "new")  # and the one after changes nothing
        assert _state(wd) == expected
