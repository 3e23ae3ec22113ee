"""What a no-change rebuild leaves to record in MLflow (pipeline.deferred): written once,
under the workdir's lock, and never a reason for a later run to fail (real MLflow, SQLite
in a temp dir)."""

from __future__ import annotations

import json
import logging
import shutil
import subprocess
import sys
import time

import pytest

from mule.config.resolution import resolve
from mule.experiments import tracking
from mule.pipeline import decisions, deferred
from mule.storage.locks import workdir_lock
from mule.storage.workdir import Workdir


def _defer(wd: Workdir) -> str:
    cfg = resolve("demo")
    decision = decisions.Decision("ingest", "k" * 24, {}, False, "key kkkkkkkkkkkk", record={"run_id": None})
    return deferred.defer(wd, cfg, "rebuild", {"ingest": decision}, {}).stem


def _recorded(wd: Workdir, marker: str) -> list:
    return tracking.find_runs(wd, "embedded", f"tags.`{deferred.MARK}` = '{marker}'")


def test_a_record_that_cannot_be_written_is_set_aside_with_one_warning_and_the_rest_are_written(tmp_path, caplog):
    wd = Workdir.at(tmp_path)
    good = _defer(wd)
    # a record left by another version of mule: its config names an option this one lacks
    renamed = deferred.folder(wd) / "20000101T000000-renamed.json"
    data = json.loads((deferred.folder(wd) / f"{good}.json").read_text())
    data["config"]["train"]["epochs_renamed"] = 3
    renamed.write_text(json.dumps(data))
    cut = deferred.folder(wd) / "20000101T000001-cut.json"
    cut.write_text('{"name": "rebu')  # a power cut half-way through writing it
    with caplog.at_level(logging.WARNING, logger="mule.pipeline"):
        assert deferred.record_unrecorded(wd) == 1
    assert sorted(r.info.run_name for r in _recorded(wd, good)) == ["ingest", "rebuild"]
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "2 deferred MLflow records could not be written" in warnings[0]
    aside = deferred.set_aside_folder(wd)
    assert sorted(p.name for p in aside.glob("*.json")) == sorted([cut.name, renamed.name])  # kept for a look
    assert "epochs_renamed" in (aside / f"{renamed.stem}.why.txt").read_text()
    assert not list(deferred.folder(wd).glob("*.json"))
    assert deferred.record_unrecorded(wd) == 0  # nothing pending: the next run is not blocked


def test_a_record_is_written_once_whatever_point_a_crash_cut_it_at(tmp_path):
    wd = Workdir.at(tmp_path)
    marker = _defer(wd)
    path = deferred.folder(wd) / f"{marker}.json"
    kept = path.read_bytes()
    assert deferred.record_unrecorded(wd) == 1
    path.write_bytes(kept)  # a crash after its runs were written, before the file was deleted
    deferred.record_unrecorded(wd)
    assert sorted(r.info.run_name for r in _recorded(wd, marker)) == ["ingest", "rebuild"]
    assert not path.exists()

    # a crash half-way: its parent run was left RUNNING with one of its children
    marker = _defer(wd)
    client = tracking.client(wd)
    parent = client.create_run(tracking.experiment_id(wd, "embedded"), run_name="rebuild",
                               tags={deferred.MARK: marker}).info.run_id  # fmt: skip
    client.create_run(tracking.experiment_id(wd, "embedded"), run_name="ingest",
                      tags={deferred.MARK: marker, "mlflow.parentRunId": parent})  # fmt: skip
    assert deferred.record_unrecorded(wd) == 1
    runs = _recorded(wd, marker)
    assert sorted(r.info.run_name for r in runs) == ["ingest", "rebuild"]
    assert all(r.info.status == "FINISHED" for r in runs) and parent not in {r.info.run_id for r in runs}


def _hold(wd: Workdir, seconds: float, brief: bool) -> subprocess.Popen:
    """Another process holding the workdir's lock for `seconds`."""
    script = (f"import time; from mule.storage.locks import workdir_lock; from mule.storage.workdir import "
              f"Workdir\nwith workdir_lock(Workdir.at({str(wd.root)!r}), 'train', brief={brief}):\n"
              f"    print('held', flush=True); time.sleep({seconds})")  # fmt: skip
    holder = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "held"
    return holder


@pytest.mark.slow
def test_the_recorder_writes_under_the_workdir_lock_and_a_run_waits_for_it_rather_than_refusing(tmp_path):
    from mule.storage.locks import WorkdirBusyError

    wd = Workdir.at(tmp_path)
    marker = _defer(wd)
    tracking.client(wd)  # the store exists before the clock starts
    holder = _hold(wd, 1.5, brief=False)  # a run in progress
    try:
        assert deferred.record_unrecorded(wd, patience=0.3) == 0  # left for the run that holds it, or the next
        assert (deferred.folder(wd) / f"{marker}.json").exists() and not _recorded(wd, marker)
    finally:
        holder.wait(timeout=30)
    assert deferred.record_unrecorded(wd, patience=0.5) == 1

    holder = _hold(wd, 1.0, brief=True)  # the recorder: a run that starts meanwhile waits for it
    started = time.monotonic()
    with workdir_lock(wd, "train"):
        assert time.monotonic() - started > 0.3
    holder.wait(timeout=30)
    holder = _hold(wd, 1.0, brief=False)
    with pytest.raises(WorkdirBusyError):  # a real run is refused at once, as before
        with workdir_lock(wd, "train"):
            pass
    holder.wait(timeout=30)
    shutil.rmtree(deferred.folder(wd), ignore_errors=True)


@pytest.mark.slow
def test_a_brief_holder_that_empties_its_file_before_letting_go_is_still_waited_for(tmp_path):
    """A holder clears the lock file, then unlocks: a run that has waited more than a second
    for a brief holder sees an empty file for that moment, and still waits it out."""
    wd = Workdir.at(tmp_path)
    wd.lock_path.touch()
    script = (f"import fcntl, json, os, time\nfd = os.open({str(wd.lock_path)!r}, os.O_RDWR)\n"
              "fcntl.flock(fd, fcntl.LOCK_EX)\n"
              "os.pwrite(fd, json.dumps({'pid': os.getpid(), 'stage': 'recording', 'brief': True}).encode(), 0)\n"
              "print('held', flush=True)\ntime.sleep(1.5)\nos.ftruncate(fd, 0)\ntime.sleep(0.6)\n"
              "fcntl.flock(fd, fcntl.LOCK_UN)\n")  # fmt: skip
    holder = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "held"
    started = time.monotonic()
    with workdir_lock(wd, "train"):  # not refused after the first second of an empty file
        assert time.monotonic() - started > 1.5
    holder.wait(timeout=30)
