"""The champion alias moves only on improvement, among comparable models (real MLflow,
SQLite in a temp dir)."""

from mule.data_catalog.workdir import Workdir
from mule.experiments import registry, tracking


def test_the_champion_moves_only_when_a_comparable_model_is_better_and_test_results_are_tagged(tmp_path):
    wd = Workdir.at(tmp_path)
    client = tracking.client(wd)
    experiment = tracking.experiment_id(wd, "toy")

    def candidate(val_mr: float, val_images: list[str], languages=("en", "de")) -> registry.Candidate:
        run = client.create_run(experiment).info.run_id
        client.log_text(run, "weights", "model/weights.txt")
        return registry.Candidate("toy", run, f"runs:/{run}/model", val_mr, languages,
                                  registry.split_digest(val_images), "test")  # fmt: skip

    val = ["img-3", "img-1", "img-2"]
    decisions = [
        registry.register(wd, candidate(50.0, val)),  # v1: the first is champion
        registry.register(wd, candidate(40.0, val)),  # v2: worse, stays behind
        registry.register(wd, candidate(60.0, list(reversed(val)))),  # v3: better (same images, any order)
        registry.register(wd, candidate(70.0, ["img-9"])),  # v4: other validation images: not comparable
        registry.register(wd, candidate(75.0, val, ("en",))),  # v5: other languages: not comparable
        registry.register(wd, candidate(60.0, val)),  # v6: a tie does not beat
    ]
    assert [d["version"] for d in decisions] == [1, 2, 3, 4, 5, 6]
    assert [d["champion"] for d in decisions] == [True, False, True, False, False, False]
    assert client.get_model_version_by_alias("mule-toy", "champion").version == 3
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
