"""Crashes lose nothing: `mule demo` killed with SIGKILL in the middle of every stage
(a real kill of the real command, at the worst moment: a table's temporary file written,
not yet renamed; the translate stage mid-way through its journal), then rerun. At every moment the
catalog's tables are whole and readable, and the rerun ends with the same tables and
the same recalls as a run that was never interrupted.

Also: two mule processes on one workdir (the second is refused, naming the first).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from mule.data_catalog.tables import Catalog
from mule.storage.workdir import Workdir

SIZES = ["--train-images", "32", "--val-images", "16", "--test-images", "16"]
TINY = ["data.image_size=48", "features.input_size=32", "features.shard_images=16", "vectors.fasttext_epochs=2", "vectors.fasttext_buckets=100000", "text.word_dim=64",
        "pretrain.epochs=1", "pretrain.batch_images=16", "train.epochs=3", "train.batch_images=16",
        "loss.mining_warmup_steps=2", "pretrain.mining_warmup_steps=2", "eval.examples=1"]  # fmt: skip


def demo(forker, workdir: Path, crash_at: str | None = None) -> tuple[int, str]:
    """`mule demo` forked from a process that has imported mule (tests/forked.py: the
    command's own entry point, on the session's Prefect server), dying by its own SIGKILL
    at the crash point as `python -m mule.commands demo` would; (exit code, output)."""
    args = ["demo", "--workdir", str(workdir), *SIZES, *[a for o in TINY for a in ("--set", o)]]
    child = forker.run(args, workdir.parent / f"{workdir.name}.log", env={"MULE_CRASH_AT": crash_at} if crash_at else {})
    return child.returncode, child.output()


def reference_run(workdir: Path) -> None:
    """The same demo, never interrupted (in this process: the code is the same, start-up is not paid twice)."""
    from mule.commands.main import main

    assert main(["demo", "--workdir", str(workdir), *SIZES, *[a for o in TINY for a in ("--set", o)]]) == 0


def tables(workdir: Path) -> dict[str, list[dict]]:
    """Every catalog table, rows sorted, without the columns that name the workdir."""
    out = {}
    for name in ("images", "captions", "rejects", "word_vectors", "captions.mt"):
        folder, _, suffix = name.partition(".")
        rows = pq.read_table(
            workdir / "catalog" / folder / f"embedded{'.' + suffix if suffix else ''}.parquet"
        ).to_pylist()
        out[name] = sorted(json.dumps({k: v for k, v in r.items() if k != "path"}, sort_keys=True, default=str)
                            for r in rows)  # fmt: skip
    return out


def features(workdir: Path) -> dict[str, np.ndarray]:
    parts = sorted((workdir / "catalog" / "features" / "embedded").glob("*/part-*.parquet"))
    rows = [row for part in parts for row in pq.read_table(part).to_pylist()]
    ids = [r["image_id"] for r in rows]
    assert len(ids) == len(set(ids)), "an image has features twice"
    return {r["image_id"]: np.asarray(r["vector"]) for r in rows}


def leftovers(workdir: Path) -> list[Path]:
    return [p for p in workdir.rglob(".*.tmp-*")]


def console_for_people(output: str) -> None:
    """What `mule demo` shows: a line per stage event and progress, no Prefect or MLflow
    chatter (no links to a server that is gone when the run ends, no download bars),
    the recall table after every logged line, the run's log file named last."""
    lines = output.strip().splitlines()
    assert len(lines) <= 60, output
    for noise in ("View at", "Flow run", "Task run", "Downloading artifacts", "| INFO", "mlflow."):
        assert noise not in output, noise
    logged = [n for n, line in enumerate(lines) if re.match(r"\d\d:\d\d:\d\d ", line)]
    table = [n for n, line in enumerate(lines) if line.startswith("| en ")]
    assert logged and table and max(logged) < min(table), output
    assert lines[-1].startswith("wall time: ") and "/logs/" in lines[-1], lines[-1]
    log_file = Path(lines[-1].rpartition("the run's whole log: ")[2])
    text = log_file.read_text()
    assert "mule.pipeline - evaluate: ran" in text and "| stage | decision |" in text, text[-3000:]


@pytest.mark.slow
def test_killed_stages_resume_and_end_as_if_never_interrupted(tmp_path, forker, prefect_api_url, never_interrupted):
    reference = never_interrupted
    crashed = tmp_path / "crashed"

    # 1. Ingest killed between writing the captions table and renaming it into place.
    code, _ = demo(forker, crashed, crash_at="write:captions/embedded.parquet")
    assert code == -signal.SIGKILL
    assert (crashed / "catalog" / "images" / "embedded.parquet").exists()
    assert not (crashed / "catalog" / "captions" / "embedded.parquet").exists()  # no half-written table
    assert leftovers(crashed)  # the temporary file of the killed write
    catalog = Catalog(Workdir.at(crashed))
    assert catalog.query("SELECT count(*) AS n FROM images").to_pylist()[0]["n"] == 64  # readable meanwhile

    # 2. Translate killed after its 40th translation: the journal holds what reached the disk
    # (the offline lexicon backend does not fsync every line, googletrans does), no table yet.
    code, _ = demo(forker, crashed, crash_at="journal:embedded@40")
    assert code == -signal.SIGKILL
    journal = crashed / "catalog" / "translations" / "embedded.journal.jsonl"
    kept = 0
    for line in journal.read_text().splitlines():
        with contextlib.suppress(ValueError):  # the last line of a killed writer may be cut short
            kept += bool(json.loads(line))
    assert 0 < kept <= 40
    assert not (crashed / "catalog" / "translations" / "embedded.parquet").exists()

    # 3. Features killed while writing their second part: the first part stays whole; the
    # translate stage ran again first and took the journal's translations from it.
    code, output = demo(forker, crashed, crash_at="write:*/part-*-00001.parquet")
    assert code == -signal.SIGKILL, output[-3000:]  # once (2026-11-28, full suite) exit 2: what it said, next time
    replayed = re.search(r"(\d+) translated now, (\d+) from the cache", output)
    assert replayed and int(replayed[2]) == kept, output[-3000:]
    assert len(features(crashed)) == 16

    # 4.-5. Text and LP killed while writing their outputs: nothing half-written.
    for point, output_file in (("write:word_vectors/embedded.parquet", "catalog/word_vectors/embedded.parquet"),
                               ("write:embedded/pretrain.pt", "models/embedded/pretrain.pt")):  # fmt: skip
        code, _ = demo(forker, crashed, crash_at=point)
        assert code == -signal.SIGKILL and not (crashed / output_file).exists(), point

    # 6. Training killed while writing the checkpoint after its second epoch.
    code, _ = demo(forker, crashed, crash_at="write:embedded/model-checkpoint.pt@2")
    assert code == -signal.SIGKILL
    assert (crashed / "models" / "embedded" / "model-checkpoint.pt").exists()  # epoch 1's

    # 7. Evaluation killed while writing its results; training resumed from epoch 1 first.
    code, output = demo(forker, crashed, crash_at="write:embedded/evaluation.json")
    assert code == -signal.SIGKILL
    assert "resuming from the checkpoint after epoch 1" in output
    assert not (crashed / "results" / "embedded" / "evaluation.json").exists()

    # 8. The rerun finishes and equals the uninterrupted run; its console is for people.
    code, output = demo(forker, crashed)
    assert code == 0, output[-3000:]
    console_for_people(output)
    assert tables(crashed) == tables(reference)
    got, want = features(crashed), features(reference)
    assert got.keys() == want.keys()
    for image_id, vector in want.items():
        np.testing.assert_allclose(got[image_id], vector, rtol=0, atol=1e-5)
    recalls = [json.loads((w / "results" / "embedded" / "evaluation.json").read_text())["table"] for w in
               (crashed, reference)]  # fmt: skip
    assert recalls[0] == recalls[1]  # the resumed training is the same training
    assert not leftovers(crashed)  # the killed writers' temporary files were cleaned up

    # 5. History reads well: the last rebuild's runs, read back from MLflow, say what they
    # are, which code and Prefect flow run made them (with its link: a server was used),
    # and which stages the rerun reused (those that had finished before the kills).
    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{crashed / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("mule/embedded")
    parent = client.search_runs([experiment.experiment_id], "attributes.run_name = 'rebuild'",
                                order_by=["attributes.start_time DESC"])[0]  # fmt: skip
    children = client.search_runs([experiment.experiment_id], f"tags.mlflow.parentRunId = '{parent.info.run_id}'")
    status = {r.info.run_name: r.data.tags["mule.stage_status"] for r in children}
    assert status == {"ingest": "reused", "translate": "reused", "features": "reused", "text": "reused",
                      "pretrain": "reused", "train": "reused", "evaluate": "ran", "index": "ran"}  # fmt: skip
    for run in [parent, *children]:
        tags = run.data.tags
        assert tags["mule.dataset"] == "embedded" and tags["mule.preset"] == "demo"
        assert tags["mule.stage"] == run.info.run_name and tags["mule.code_version"]
        url = tags["prefect.flow_run_url"]
        assert url.startswith(prefect_api_url.removesuffix("/api")) and url.endswith(tags["prefect.flow_run_id"])


def test_a_second_process_on_the_same_workdir_is_refused_naming_the_first(tmp_path):
    from mule.storage.locks import holder, workdir_lock

    workdir = Workdir.at(tmp_path / "work")
    script = (
        "import sys, time\n"
        "from mule.storage.locks import workdir_lock\n"
        "from mule.storage.workdir import Workdir\n"
        f"with workdir_lock(Workdir.at({str(workdir.root)!r}), 'train'):\n"
        "    print('holding', flush=True)\n"
        "    time.sleep(60)\n"
    )
    first = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True,
                             cwd=Path(__file__).resolve().parents[1])  # fmt: skip
    try:
        assert first.stdout.readline().strip() == "holding"
        from mule.storage.locks import WorkdirBusyError

        with pytest.raises(WorkdirBusyError) as error, workdir_lock(workdir, "ingest"):
            pass
        message = str(error.value)
        assert f"pid {first.pid}" in message and "stage 'train'" in message and str(workdir.root) in message
        assert holder(workdir)["pid"] == first.pid
    finally:
        first.kill()  # SIGKILL: the kernel releases the lock with the process
        first.wait()
    deadline = time.time() + 5
    while True:  # the next process gets the workdir at once; no stale lock to clear by hand
        try:
            with workdir_lock(workdir, "ingest"):
                assert holder(workdir)["pid"] == os.getpid()
            break
        except Exception:
            if time.time() > deadline:
                raise
            time.sleep(0.1)


def test_a_normal_run_has_no_fault_injection_in_its_write_path():
    """Fault injection is a test seam: a write passes storage.atomic's point, where
    nothing listens unless MULE_CRASH_AT or MULE_BUG_AT asked faults.install() to."""
    code = ("import mule.commands.main, sys; from mule.storage import atomic; "
            "print(len(atomic.POINTS), 'mule.storage.faults' in sys.modules)")  # fmt: skip
    env = {k: v for k, v in os.environ.items() if k not in ("MULE_CRASH_AT", "MULE_BUG_AT")}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert done.stdout.split() == ["0", "False"], done.stdout + done.stderr
    from mule.storage import atomic, faults

    try:
        faults.install()
        assert atomic.POINTS == [faults.crash_point]
    finally:
        atomic.POINTS.clear()
