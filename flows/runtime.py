"""Process environment for Prefect and MLflow; must run before either is imported."""

from __future__ import annotations

import logging
import os
from pathlib import Path


def prepare_environment(workdir: Path) -> None:
    """Ephemeral Prefect (no server) with its home in the workdir, unless the user has
    pointed Prefect elsewhere; mule's own loggers in Prefect's run logs; no telemetry."""
    if not os.environ.get("PREFECT_API_URL"):
        os.environ.setdefault("PREFECT_HOME", str(workdir / "prefect"))
    os.environ.setdefault("PREFECT_LOGGING_EXTRA_LOGGERS", "mule")
    os.environ.setdefault("PREFECT_LOGGING_TO_API_WHEN_MISSING_FLOW", "ignore")  # mule_core used outside a flow
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "60")
    os.environ.setdefault("DO_NOT_TRACK", "true")
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    os.environ.setdefault("GIT_PYTHON_REFRESH", "quiet")
    # Prefect attaches its handlers to the "mule" loggers; they must pass INFO through.
    logging.getLogger("mule").setLevel(logging.INFO)


class _NoTracebackForUserErrors(logging.Filter):
    """Prefect logs a failed task or flow run with the exception's traceback; for a user
    error (mule_core.errors) the message is the whole story."""

    def filter(self, record: logging.LogRecord) -> bool:
        from mule_core.errors import is_user_error

        if record.exc_info and record.exc_info[1] is not None and is_user_error(record.exc_info[1]):
            record.exc_info = None
            record.exc_text = None
        return True


def quiet_user_errors() -> None:
    """Installs the filter on Prefect's run loggers (idempotent; Prefect may reconfigure logging)."""
    for name in ("prefect.task_runs", "prefect.flow_runs", "prefect.flow_engine", "prefect.task_engine"):
        logger = logging.getLogger(name)
        if not any(isinstance(f, _NoTracebackForUserErrors) for f in logger.filters):
            logger.addFilter(_NoTracebackForUserErrors())


def dask_task_runner(features: dict, shards: int):
    """prefect-dask's runner for the features shards: on the scheduler at
    features.dask_address, else on a LocalCluster with one process per GPU (each shard
    picks its GPU from the worker's number), or two on the CPU, splitting the cores."""
    from prefect_dask import DaskTaskRunner

    if features["dask_address"]:
        return DaskTaskRunner(address=features["dask_address"])
    import torch

    cores = os.cpu_count() or 1
    gpus = torch.cuda.device_count() if features["device"] in ("auto", "cuda") else 0
    workers = features["dask_workers"] or gpus or min(2, cores)
    workers = max(1, min(workers, shards))
    threads = str(max(1, cores // workers))
    env = {"OMP_NUM_THREADS": threads, "MKL_NUM_THREADS": threads}  # no oversubscription of the cores
    return DaskTaskRunner(cluster_class="distributed.LocalCluster",
                          cluster_kwargs={"n_workers": workers, "threads_per_worker": 1, "processes": True,
                                          "env": env, "dashboard_address": None})  # fmt: skip
