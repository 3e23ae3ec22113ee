"""What every task needs: its config, its workdir, a logger."""

from __future__ import annotations

import logging
import sys
from typing import Any

from data_catalog.catalog import Catalog
from data_catalog.workdir import Workdir
from mule_core.config import MuleConfig, from_dict


def logger() -> logging.Logger | logging.LoggerAdapter:
    """Prefect's run logger inside a run, a plain logger outside one (e.g. in a bench script,
    or a rebuild with nothing to run, which never imports Prefect)."""
    if "prefect" not in sys.modules:
        return logging.getLogger("mule.tasks")
    try:
        from prefect import get_run_logger

        return get_run_logger()
    except Exception:  # noqa: BLE001 - MissingContextError outside a run
        return logging.getLogger("mule.tasks")


def context(workdir: str, config: dict[str, Any]) -> tuple[Workdir, Catalog, MuleConfig]:
    wd = Workdir.at(workdir)
    return wd, Catalog(wd), from_dict(config)
