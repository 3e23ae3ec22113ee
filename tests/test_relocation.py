"""A copied or moved workdir is its own: nothing it runs writes into the original."""

import shutil

import pytest
from mlflow.tracking import MlflowClient

from mule.experiments import mlflow_store, tracking
from mule.experiments.relocation import adopt
from mule.storage.workdir import Workdir


def a_workdir_with_a_run(root) -> tuple[Workdir, str]:
    wd = Workdir.at(root)
    adopt(wd)
    experiment = tracking.experiment_id(wd, "d")
    run = MlflowClient(wd.mlflow_uri).create_run(experiment).info.run_id
    return wd, run


def test_a_new_workdir_records_where_it_is(tmp_path):
    wd, _ = a_workdir_with_a_run(tmp_path / "w")
    assert wd.recorded_root() == wd.root
    assert adopt(wd) is None  # not moved


@pytest.mark.parametrize("marker", [True, False], ids=["marker", "inferred-from-mlflow"])
def test_a_copy_points_mlflow_at_its_own_artifacts(tmp_path, marker):
    original, run = a_workdir_with_a_run(tmp_path / "original")
    shutil.copytree(original.root, tmp_path / "copy")
    copy = Workdir.at(tmp_path / "copy")
    if not marker:  # a workdir made before the marker existed: the old root is read off MLflow
        copy.home_marker.unlink()
    assert adopt(copy) == original.root
    client = MlflowClient(copy.mlflow_uri)
    assert client.get_experiment_by_name("mule/d").artifact_location == copy.artifacts_dir.as_uri()
    assert client.get_run(run).info.artifact_uri.startswith(copy.artifacts_dir.as_uri() + "/")
    assert copy.recorded_root() == copy.root
    # The original is untouched and still points at itself.
    assert MlflowClient(original.mlflow_uri).get_run(run).info.artifact_uri.startswith(original.artifacts_dir.as_uri())
    assert adopt(copy) is None  # done once


@pytest.mark.slow
def test_a_store_pointing_somewhere_unknown_is_refused(tmp_path):
    wd = Workdir.at(tmp_path / "w")
    MlflowClient(wd.mlflow_uri).create_experiment("mule/d", artifact_location=(tmp_path / "elsewhere").as_uri())
    with pytest.raises(mlflow_store.WorkdirError, match="outside this workdir"):
        adopt(wd)


def test_experiments_open_on_training_runs_in_the_ui(tmp_path):
    wd, run = a_workdir_with_a_run(tmp_path / "w")
    experiment = MlflowClient(wd.mlflow_uri).get_experiment_by_name("mule/d")
    assert experiment.tags["mlflow.experimentKind"] == "custom_model_development"  # not the GenAI view
