"""prefect.yaml: every deployment points at a real flow with parameters it accepts."""

import datetime
import inspect
from pathlib import Path

import pytest
import yaml
from cronsim import CronSim
from prefect.flows import load_flow_from_entrypoint

from mule.pipeline.declaration import BY_NAME, REBUILD

ROOT = Path(__file__).resolve().parents[1]


def deployments() -> list[dict]:
    return yaml.safe_load((ROOT / "prefect.yaml").read_text())["deployments"]


@pytest.mark.slow
def test_a_scheduled_rebuild_and_one_deployment_per_stage(monkeypatch):
    monkeypatch.chdir(ROOT)
    names = [d["name"] for d in deployments()]
    assert names == ["weekly-rebuild", *REBUILD]  # one deployment per declared stage
    for deployment in deployments():
        flow = load_flow_from_entrypoint(deployment["entrypoint"])
        accepted = set(inspect.signature(flow.fn).parameters)
        assert set(deployment.get("parameters", {})) <= accepted, deployment["name"]
        assert flow.name == ("rebuild" if deployment["name"] == "weekly-rebuild" else deployment["name"])
        if deployment["name"] in BY_NAME:  # described by its flow, that is by the stage's declaration
            assert "description" not in deployment and flow.description == BY_NAME[deployment["name"]].summary
        assert deployment["work_pool"]["name"] == "mule-process"
        # The workdir travels with the deployment, from MULE_HOME at `prefect deploy` time.
        assert deployment["parameters"]["workdir"] == "{{ $MULE_HOME }}", deployment["name"]
    (rebuild,) = [d for d in deployments() if d["name"] == "weekly-rebuild"]
    assert next(iter(CronSim(rebuild["schedules"][0]["cron"], datetime.datetime(2026, 1, 1))))


def test_a_deployment_made_without_mule_home_refuses_to_run(tmp_path):
    """`prefect deploy` without MULE_HOME leaves "" (or the placeholder): the run must
    stop with a message, not write into whatever folder the worker runs in."""
    import pytest

    from mule.flows.stages import _workdir
    from mule.mule_core.settings import ConfigError

    for unset in ("", "{{ $MULE_HOME }}"):
        with pytest.raises(ConfigError, match="made without MULE_HOME set"):
            _workdir(unset)
    assert _workdir(str(tmp_path)).root == tmp_path.resolve()
