"""A rebuild with nothing to run answers in a second, and is recorded in MLflow right after.

Deciding that every stage is up to date needs the keys, not MLflow (seconds to import and
open its store) nor Prefect nor torch. So the command writes what MLflow is to record (the
rebuild's run, a run per stage saying "reused" and why, the test recalls) to
state/unrecorded/<time>.json and hands it to a process of its own, started detached, that
records it; the next run that tracks anything records what is left first (a killed
recorder, a machine switched off). A user sees the run in `mule ui` a few seconds after
the command returned, tagged `mule.recorded_later`.

    python -m mule.pipeline.deferred WORKDIR      # what the command starts
"""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
import sys
import time
import uuid
from dataclasses import fields
from pathlib import Path

from mule.data_catalog.atomic import write_json_atomic
from mule.data_catalog.workdir import Workdir
from mule.pipeline.config import MuleConfig, from_dict, to_dict

from . import reuse


def folder(workdir: Workdir) -> Path:
    return workdir.state_dir / "unrecorded"


def defer(workdir: Workdir, cfg: MuleConfig, name: str, decided: dict[str, reuse.Decision], results: dict) -> Path:
    """Writes what the no-change rebuild is to record; returns the file."""
    path = folder(workdir) / f"{time.strftime('%Y%m%dT%H%M%S')}-{uuid.uuid4().hex[:8]}.json"
    decisions = []
    for decision in decided.values():
        entry = reuse.as_dict(decision)
        entry["record_run_id"] = (decision.record or {}).get("run_id")
        decisions.append(entry)
    kept = {k: v for k, v in results.items() if k in ("evaluate", "ablation")}
    write_json_atomic({"name": name, "config": to_dict(cfg), "decisions": decisions, "results": kept,
                       "when": time.time()}, path)  # fmt: skip
    return path


def start_recorder(workdir: Workdir) -> None:
    """The detached process that records what was deferred (it outlives the command)."""
    log = folder(workdir) / "recorder.log"
    with open(log, "ab") as out:
        subprocess.Popen([sys.executable, "-m", "mule.pipeline.deferred", str(workdir.root)], stdin=subprocess.DEVNULL,
                         stdout=out, stderr=out, start_new_session=True, env={**os.environ, "MULE_DEFERRED": "1"})  # fmt: skip


def record_unrecorded(workdir: Workdir) -> int:
    """Records every deferred no-change rebuild in MLflow, oldest first (one recorder at a
    time); returns how many. Nothing to do: returns at once, importing nothing more."""
    pending = sorted(folder(workdir).glob("*.json"))
    if not pending:
        return 0
    with open(folder(workdir) / "recorder.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        done = 0
        for path in sorted(folder(workdir).glob("*.json")):  # again: another recorder may have taken some
            try:
                deferred = json.loads(path.read_text())
            except (OSError, ValueError):
                path.unlink(missing_ok=True)  # cut by a crash: there is nothing to record of it
                continue
            _record(workdir, deferred)
            path.unlink(missing_ok=True)
            done += 1
        return done


def _record(workdir: Workdir, deferred: dict) -> None:
    from mule.experiments import tracking

    from .publish import publish_rebuild

    cfg = from_dict(deferred["config"])
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(deferred["when"]))
    names = {f.name for f in fields(reuse.Decision)}
    describes = {}
    with tracking.run(workdir, cfg, deferred["name"]) as run_id:
        tracking.Tracker(workdir, run_id).tags({"mule.recorded_later": f"the rebuild of {when}, which had nothing to "
                                                                      "run, recorded after it returned"})  # fmt: skip
        for entry in deferred["decisions"]:
            decision = reuse.Decision(**{k: v for k, v in entry.items() if k in names})
            decision.record = {"run_id": entry.get("record_run_id")}
            with tracking.run(workdir, cfg, decision.stage, run_id) as child:
                tracking.Tracker(workdir, child).tags(reuse.tags(decision))
            describes[decision.stage] = decision.describe()
        publish_rebuild(workdir, cfg, deferred["results"], describes, run_id)


if __name__ == "__main__":
    record_unrecorded(Workdir.at(sys.argv[1]))
