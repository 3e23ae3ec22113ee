"""A rebuild with nothing to run answers in a second, and is recorded in MLflow later.

Deciding that every stage is up to date needs the keys, not MLflow (seconds to import and
open its store) nor Prefect nor torch. So the command writes what MLflow is to record (the
rebuild's run, a run per stage saying "reused" and why, the test recalls) to
state/unrecorded/<time>.json, atomically, before it returns, and nothing after: once a
command has returned, no process of mule's writes the workdir (`mule demo && mv mule-work
elsewhere`, a backup, `rm -rf` all see it whole). The record is written into MLflow under
the workdir's lock by whoever opens MLflow next: the next run that tracks anything (first
thing), and `mule ui` (as it starts, and every few seconds while it serves: a user sees
the run in the UI), tagged `mule.recorded_later`. A record is written once (its runs carry
its file's name), and one that cannot be written (a config from another version of mule,
a damaged file) is set aside with one warning: it never blocks a run.

    python -m mule.pipeline.deferred WORKDIR      # records what waits, now, and returns
"""

from __future__ import annotations

import json
import os
import sys
import time
import uuid
from dataclasses import fields
from pathlib import Path

from mule.config.overrides import from_dict, to_dict
from mule.config.sections import MuleConfig
from mule.pipeline import decisions
from mule.storage.atomic import write_json_atomic
from mule.storage.workdir import Workdir


def folder(workdir: Workdir) -> Path:
    return workdir.state_dir / "unrecorded"


def defer(workdir: Workdir, cfg: MuleConfig, name: str, decided: dict[str, decisions.Decision], results: dict) -> Path:
    """Writes what the no-change rebuild is to record; returns the file."""
    path = folder(workdir) / f"{time.strftime('%Y%m%dT%H%M%S')}-{uuid.uuid4().hex[:8]}.json"
    entries = []
    for decision in decided.values():
        entry = decisions.as_dict(decision)
        entry["record_run_id"] = (decision.record or {}).get("run_id")
        entries.append(entry)
    kept = {k: v for k, v in results.items() if k in ("evaluate", "ablation")}
    write_json_atomic({"name": name, "config": to_dict(cfg), "decisions": entries, "results": kept,
                       "when": time.time()}, path)  # fmt: skip
    return path


def waiting(workdir: Workdir) -> int:
    """How many deferred records wait to be written into MLflow (a glob: nothing imported)."""
    return len(list(folder(workdir).glob("*.json")))


RECORDING = "recording deferred MLflow runs"
MARK = "mule.deferred_record"  # on every run a deferred record makes: which record made it


def set_aside_folder(workdir: Workdir) -> Path:
    return folder(workdir) / "set-aside"


def record_unrecorded(workdir: Workdir, patience: float = 120.0) -> int:
    """Records every deferred no-change rebuild in MLflow, oldest first, under the
    workdir's lock (waiting up to `patience` seconds for it; then the run that holds it, or
    the next, records them); returns how many. Nothing to do: returns at once, importing
    nothing more. Never raises for a record: one that cannot be written is set aside
    (state/unrecorded/set-aside/, with why) with one warning, and the run goes on."""
    if not list(folder(workdir).glob("*.json")):
        return 0
    from mule.storage.locks import WorkdirBusyError, workdir_lock

    try:
        with workdir_lock(workdir, RECORDING, patience=patience, brief=True):
            return _record_pending(workdir)
    except WorkdirBusyError:
        return 0


def _record_pending(workdir: Workdir) -> int:
    import logging

    done, failed = 0, []
    for path in sorted(folder(workdir).glob("*.json")):  # again: another recorder may have taken some
        try:
            _record(workdir, json.loads(path.read_text()), path.stem)
        except (KeyboardInterrupt, SystemExit):
            raise
        except Exception as error:  # noqa: BLE001 - any record that cannot be written must not block a run
            failed.append((path, _set_aside(workdir, path, error)))
            continue
        path.unlink(missing_ok=True)
        done += 1
    if failed:
        first, why = failed[0]
        logging.getLogger("mule.pipeline").warning(
            "%d deferred MLflow record%s could not be written and %s set aside in %s (kept for a look; runs go on): "
            "%s: %s", len(failed), "s" if len(failed) > 1 else "", "were" if len(failed) > 1 else "was",
            set_aside_folder(workdir).relative_to(workdir.root), first.name, why)  # fmt: skip
    return done


def _set_aside(workdir: Workdir, path: Path, error: Exception) -> str:
    """Moves a record that could not be written out of the way, with why beside it."""
    why = f"{type(error).__name__}: {error}".strip()
    aside = set_aside_folder(workdir)
    aside.mkdir(parents=True, exist_ok=True)
    os.replace(path, aside / path.name)
    (aside / f"{path.stem}.why.txt").write_text(why + "\n", encoding="utf-8")
    return why.splitlines()[0][:200]


def _record(workdir: Workdir, deferred: dict, marker: str) -> None:
    """One deferred record as MLflow runs, once: every run it makes carries its marker, so a
    recorder that crashed after writing them (before deleting the file) is not repeated,
    and one that crashed half-way has its runs replaced."""
    from mule.experiments import tracking
    from mule.pipeline.publish import publish_rebuild

    cfg = from_dict(deferred["config"])
    written = tracking.find_runs(workdir, cfg.data.dataset, f"tags.`{MARK}` = '{marker}'")
    if any(r.info.status == "FINISHED" and "mlflow.parentRunId" not in r.data.tags for r in written):
        return
    client = tracking.client(workdir)
    for run in written:  # cut by a crash: written again whole
        client.delete_run(run.info.run_id)
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(deferred["when"]))
    names = {f.name for f in fields(decisions.Decision)}
    describes = {}
    with tracking.run(workdir, cfg, deferred["name"], tags={MARK: marker}) as run_id:
        tracking.Tracker(workdir, run_id).tags({"mule.recorded_later": f"the rebuild of {when}, which had nothing to "
                                                                      "run, recorded after it returned"})  # fmt: skip
        for entry in deferred["decisions"]:
            decision = decisions.Decision(**{k: v for k, v in entry.items() if k in names})
            decision.record = {"run_id": entry.get("record_run_id")}
            with tracking.run(workdir, cfg, decision.stage, run_id, tags={MARK: marker}) as child:
                tracking.Tracker(workdir, child).tags(decisions.tags(decision))
            describes[decision.stage] = decision.describe()
        publish_rebuild(workdir, cfg, deferred["results"], describes, run_id)


if __name__ == "__main__":
    record_unrecorded(Workdir.at(sys.argv[1]))
