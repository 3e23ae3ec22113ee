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
