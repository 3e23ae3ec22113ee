"""MLflow, with explicit run ids.

Stages log through `Tracker(workdir, run_id)` rather than MLflow's thread-local active
run, because Prefect may run a task on another thread than its flow. One experiment
per dataset ("mule/<dataset>"); the store is SQLite in the workdir and the artifacts
sit beside it, so `mule ui` shows everything a workdir ever ran.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import math
import re
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from mlflow.entities import Metric, Param, RunTag
from mlflow.tracking import MlflowClient

from data_catalog.workdir import Workdir
from mule_core.config import MuleConfig, flatten

_INVALID_METRIC_CHARS = re.compile(r"[^A-Za-z0-9_\-. :/]")


def metric_name(key: str) -> str:
    """MLflow allows letters, digits and _-. :/ in metric names; 'en->de' becomes 'en_to_de'."""
    return _INVALID_METRIC_CHARS.sub("_", key.replace("->", "_to_").replace("@", "_at_"))


def client(workdir: Workdir) -> MlflowClient:
    return MlflowClient(tracking_uri=workdir.mlflow_uri)


def experiment_id(workdir: Workdir, dataset: str) -> str:
    c = client(workdir)
    name = f"mule/{dataset}"
    experiment = c.get_experiment_by_name(name)
    if experiment is not None:
        return experiment.experiment_id
    workdir.artifacts_dir.mkdir(parents=True, exist_ok=True)
    return c.create_experiment(name, artifact_location=workdir.artifacts_dir.as_uri())


def prefect_flow_run_id() -> str | None:
    try:
        from prefect.runtime import flow_run

        return str(flow_run.id) if flow_run.id else None
    except Exception:  # noqa: BLE001 - outside a flow run there is simply no id
        return None


class Tracker:
    def __init__(self, workdir: Workdir, run_id: str | None):
        self.workdir, self.run_id = workdir, run_id
        self.client = client(workdir) if run_id else None

    def params(self, values: dict[str, Any]) -> None:
        if not self.client:
            return
        items = [Param(k, str(v)[:6000]) for k, v in values.items()]
        for start in range(0, len(items), 100):
            self.client.log_batch(self.run_id, params=items[start : start + 100])

    def metrics(self, values: dict[str, float], step: int | None = None) -> None:
        if not self.client:
            return
        now = int(1000 * time.time())
        items = [
            Metric(metric_name(k), float(v), now, step or 0)
            for k, v in values.items()
            if v is not None and not (isinstance(v, float) and math.isnan(v))
        ]
        for start in range(0, len(items), 1000):
            self.client.log_batch(self.run_id, metrics=items[start : start + 1000])

    def tags(self, values: dict[str, str]) -> None:
        if self.client:
            self.client.log_batch(self.run_id, tags=[RunTag(k, str(v)) for k, v in values.items()])

    def artifact(self, path: Path, folder: str | None = None) -> None:
        if self.client:
            self.client.log_artifact(self.run_id, str(path), folder)

    def json(self, data: Any, name: str, folder: str | None = None) -> None:
        if not self.client:
            return
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / name
            path.write_text(json.dumps(data, indent=2, default=str))
            self.client.log_artifact(self.run_id, str(path), folder)

    def figure(self, figure, name: str) -> None:
        if self.client:
            self.client.log_figure(self.run_id, figure, name)

    def pytorch_model(self, model, name: str = "model") -> None:
        """The model as an MLflow PyTorch model (pickled; loads with mlflow.pytorch.load_model)."""
        if not self.client:
            return
        import mlflow.pytorch
        import torch

        mlflow.set_tracking_uri(self.workdir.mlflow_uri)
        # Pickle, not pt2: torch.export cannot trace packed variable-length sequences.
        # The model file in the workdir (tasks.model_io) is the weights-only alternative.
        quiet = logging.getLogger("mlflow.pytorch")
        level = quiet.level
        quiet.setLevel(logging.ERROR)
        try:
            with mlflow.start_run(run_id=self.run_id, nested=True):
                mlflow.pytorch.log_model(
                    model,
                    name=name,
                    serialization_format="pickle",
                    pip_requirements=[f"torch=={torch.__version__.split('+')[0]}", "mule"],
                )
        finally:
            quiet.setLevel(level)


def _run_tags(cfg: MuleConfig, stage: str, parent_run_id: str | None) -> dict[str, str]:
    tags = {"mule.stage": stage, "mule.dataset": cfg.data.dataset, "mule.preset": cfg.preset}
    if parent_run_id:
        tags["mlflow.parentRunId"] = parent_run_id
    flow_run = prefect_flow_run_id()
    if flow_run:
        tags["prefect.flow_run_id"] = flow_run
    return tags


@contextlib.contextmanager
def run(workdir: Workdir, cfg: MuleConfig, stage: str, parent_run_id: str | None = None) -> Iterator[str]:
    """An MLflow run for one stage (child of parent_run_id) or one rebuild (parent).

    Logs the resolved config as params and the Prefect flow-run id as a tag; ends
    FINISHED, or FAILED if the body raises.
    """
    c = client(workdir)
    created = c.create_run(
        experiment_id(workdir, cfg.data.dataset), run_name=stage, tags=_run_tags(cfg, stage, parent_run_id)
    )
    run_id = created.info.run_id
    tracker = Tracker(workdir, run_id)
    tracker.params(flatten(cfg))
    tracker.json(dataclasses.asdict(cfg), "config.json")
    status = "FAILED"
    try:
        yield run_id
        status = "FINISHED"
    finally:
        c.set_terminated(run_id, status)


def find_runs(workdir: Workdir, dataset: str, filter_string: str = "") -> list:
    c = client(workdir)
    experiment = c.get_experiment_by_name(f"mule/{dataset}")
    if experiment is None:
        return []
    return c.search_runs(
        [experiment.experiment_id], filter_string=filter_string, order_by=["attributes.start_time DESC"]
    )
