"""A stage's MLflow run names the Prefect deployment its rebuild came from, and a run that
no deployment made asks the Prefect API nothing to find that out (experiments.tracking)."""

from __future__ import annotations

from prefect import flow
from prefect.client.orchestration import get_client
from prefect.flow_engine import run_flow

from mule.experiments import tracking


@flow(name="rebuild-like")
def rebuild_like() -> dict:
    return {"rebuild": tracking.prefect_context(), "stage": stage_like()}


@flow(name="stage-like")
def stage_like() -> dict:
    return tracking.prefect_context()


def test_a_flow_run_no_deployment_made_gets_no_deployment_tag_and_asks_no_api(monkeypatch):
    import prefect.runtime.deployment

    asked = []  # prefect_context swallows errors (tags are a nicety): the calls are counted
    lookup = prefect.runtime.deployment.FIELDS["id"]
    monkeypatch.setitem(prefect.runtime.deployment.FIELDS, "id", lambda: asked.append(1) or lookup())
    monkeypatch.delenv("PREFECT__FLOW_RUN_ID", raising=False)
    tags = rebuild_like()
    assert asked == []
    for run in ("rebuild", "stage"):
        assert tags[run]["prefect.flow_run_id"] and "prefect.deployment" not in tags[run]


def test_a_deployment_s_run_and_the_stage_flows_inside_it_name_the_deployment(monkeypatch):
    with get_client(sync_client=True) as client:
        flow_id = client.create_flow_from_name("rebuild-like")
        deployment = client.create_deployment(flow_id=flow_id, name="weekly-rebuild")
        flow_run = client.create_flow_run_from_deployment(deployment)
    monkeypatch.setenv("PREFECT__FLOW_RUN_ID", str(flow_run.id))  # as a worker starts a deployment's run
    tags = run_flow(rebuild_like, flow_run=flow_run)
    assert tags["rebuild"]["prefect.deployment"] == "rebuild-like/weekly-rebuild"
    assert tags["rebuild"]["prefect.flow_run_id"] == str(flow_run.id)
    assert tags["stage"]["prefect.deployment"] == "stage-like/weekly-rebuild"
    assert tags["stage"]["prefect.flow_run_id"] != str(flow_run.id)
