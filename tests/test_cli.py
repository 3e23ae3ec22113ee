"""The `mule` command line."""

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request

import pytest

from mule.commands.main import build_parser, main, overrides_from


def test_config_prints_the_resolved_config(capsys):
    assert main(["config", "--preset", "paper", "--set", "train.epochs=2", "--dataset", "multi30k"]) == 0
    cfg = json.loads(capsys.readouterr().out)
    assert cfg["train"]["epochs"] == 2 and cfg["model"]["lstm_dim"] == 1024 and cfg["data"]["dataset"] == "multi30k"


def test_unknown_stage_is_a_one_line_error(capsys):
    assert main(["run", "ingest", "trian"]) == 2
    assert "unknown stage(s) trian" in capsys.readouterr().err


def test_force_names_stages(capsys, tmp_path):
    args = build_parser().parse_args(["demo", "--force", "features", "--force", "train"])
    assert args.force == ["features", "train"]
    assert main(["run", "evaluate", "--force", "featurs", "--workdir", str(tmp_path)]) == 2
    assert "--force featurs: not a stage; stages are: ingest, translate," in capsys.readouterr().err


@pytest.mark.parametrize("command", [["run", "all"], ["demo"]])
def test_the_removed_sequential_flag_is_refused_saying_why(capsys, tmp_path, command):
    with pytest.raises(SystemExit) as stop:
        main([*command, "--sequential", "--workdir", str(tmp_path)])
    assert stop.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1].endswith(
        "error: --sequential was removed on 2026-12-06: stages run one at a time always; drop the flag")
    assert list(tmp_path.iterdir()) == []


def test_search_needs_a_sentence_or_an_image_and_a_trained_model(capsys, tmp_path):
    assert main(["search", "--workdir", str(tmp_path)]) == 2
    assert "search needs a sentence or --image PATH" in capsys.readouterr().err
    assert main(["search", "a red circle", "--workdir", str(tmp_path)]) == 2
    assert "no trained model in" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []  # a reading command made nothing there (no MLflow store, no catalog)


def test_bad_option_is_a_one_line_error(capsys, tmp_path):
    assert main(["run", "train", "--workdir", str(tmp_path), "--set", "train.epochs=lots"]) == 2
    assert "config option train.epochs" in capsys.readouterr().err


def test_ui_needs_a_server_process(capsys, tmp_path):
    assert main(["ui", "--workdir", str(tmp_path), "--workers", "0"]) == 2
    assert "--workers must be at least 1, got 0" in capsys.readouterr().err


def test_a_dataset_without_source_fails_before_prefect_starts(capsys, tmp_path):
    started = time.perf_counter()
    assert main(["run", "ingest", "--dataset", "multi30k", "--workdir", str(tmp_path)]) == 2
    assert "pass --source PATH" in capsys.readouterr().err
    assert time.perf_counter() - started < 5
    assert (
        main(["run", "ingest", "--dataset", "multi30k", "--source", str(tmp_path / "nope"), "--workdir", str(tmp_path)])
        == 2
    )
    assert "does not exist" in capsys.readouterr().err


def test_run_accepts_the_issue_examples():
    args = build_parser().parse_args(
        ["run", "ingest", "--dataset", "multi30k", "--source", "../shared/datasets/multi30k"]
    )
    assert args.stages == ["ingest"] and args.source == "../shared/datasets/multi30k"
    args = build_parser().parse_args(["demo", "--workdir", "w", "--train-images", "10", "--seed", "3"])
    assert (args.train_images, args.seed, args.val_images, args.dataset) == (10, 3, None, "multi30k")
    args = build_parser().parse_args(["demo", "--dataset", "coco"])  # sizes from the dataset's defaults
    assert args.dataset == "coco" and args.train_images is None
    args = build_parser().parse_args(["run", "add-language", "--lang", "ja", "--dataset", "embedded-coco"])
    assert overrides_from(args) == {"add.languages": "ja", "data.dataset": "embedded-coco"}


def test_catalog_of_an_empty_workdir(capsys, tmp_path):
    assert main(["catalog", "--workdir", str(tmp_path)]) == 0
    assert "is empty" in capsys.readouterr().out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_ui_serves_the_workdir_store_and_lands_on_the_runs(tmp_path):
    """`mule ui` prints the address of the runs; opened in headless Chromium, it shows the
    runs table in the model-training view, not MLflow 3's GenAI overview (which a plain
    experiment address opens). MLflow's job runner (eight more processes) is not started."""
    from mlflow.tracking import MlflowClient

    from mule.experiments.tracking import EXPERIMENT_KIND
    from mule.storage.workdir import Workdir
    from tests import browser

    wd = Workdir.at(tmp_path)
    client = MlflowClient(wd.mlflow_uri)
    experiment = client.create_experiment("mule/ui-check", artifact_location=wd.artifacts_dir.as_uri(),
                                          tags=EXPERIMENT_KIND)  # fmt: skip
    client.create_run(experiment, run_name="probe-run")
    port = free_port()
    opened = tmp_path / "opened.txt"  # --open: the "browser" ($BROWSER, as webbrowser reads it) records the address
    recorder = tmp_path / "browser.sh"
    recorder.write_text(f'#!/bin/sh\necho "$1" > {opened}\n')
    recorder.chmod(0o755)
    ui = subprocess.Popen([sys.executable, "-m", "mule.commands", "ui", "--workdir", str(tmp_path), "--port", str(port),
                           "--open"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          env={**os.environ, "BROWSER": str(recorder)})  # fmt: skip
    try:
        printed = [ui.stdout.readline(), ui.stdout.readline()]
        runs = printed[1].removeprefix("runs: ").strip()
        assert runs == f"http://127.0.0.1:{port}/#/experiments/{experiment}/runs?workflowType=machine_learning", printed
        deadline = time.time() + 90
        body = None
        while time.time() < deadline and body is None:
            try:
                url = f"http://127.0.0.1:{port}/api/2.0/mlflow/experiments/search?max_results=10"
                body = json.loads(urllib.request.urlopen(url, timeout=2).read())
            except OSError:
                if ui.poll() is not None:
                    pytest.fail(ui.stdout.read()[-2000:])
                time.sleep(0.5)
        assert body is not None, "the MLflow UI did not answer"
        assert "mule/ui-check" in {e["name"] for e in body["experiments"]}
        deadline = time.time() + 30
        while time.time() < deadline and not opened.exists():
            time.sleep(0.2)
        assert opened.read_text().strip() == runs  # --open opened the runs once the UI answered
        with browser.page() as page:
            page.goto(runs)
            page.get_by_text("probe-run").wait_for(timeout=60_000)  # a row of the runs table
            assert page.get_by_role("columnheader", name="Run Name").count() >= 1
            assert "/runs" in page.url and "workflowType=machine_learning" in page.url
            assert "overview" not in page.url and "genai" not in page.url
        import psutil

        started = [" ".join(p.cmdline()) for p in psutil.Process(ui.pid).children(recursive=True)]
        assert not [c for c in started if "_job_runner" in c or "huey" in c], started  # MLflow's job runner: off
        sent = time.monotonic()
        ui.send_signal(signal.SIGINT)  # Ctrl-C: the command and MLflow's server processes go
        rest = ui.communicate(timeout=20)[0]
        assert ui.returncode == 130 and time.monotonic() - sent < 3.0, rest
        assert f"mule ui: stopped by Ctrl-C; port {port} is free" in rest and "Traceback" not in rest
    finally:
        if ui.poll() is None:  # a check failed or skipped (no Chromium): MLflow's server is in a session of its own
            import psutil

            server = psutil.Process(ui.pid).children(recursive=True)
            ui.kill()
            ui.wait(timeout=20)
            for process in server:  # else it outlives the test (and the suite) on its port
                with contextlib.suppress(psutil.NoSuchProcess):
                    process.kill()
    with pytest.raises(OSError):  # the UI's server went with it
        urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2)


@pytest.mark.slow
def test_a_user_error_is_one_line_exit_2_and_the_failed_runs_say_the_same(tmp_path, forker):
    """The real command (forked, with its own stderr: tests/forked.py) on a broken Multi30K
    copy: no traceback on the console, and the message is the failed Prefect flow run's
    state message and the failed MLflow run's mule.error tag."""
    from mlflow.tracking import MlflowClient
    from prefect.client.orchestration import get_client

    from mule.storage.workdir import Workdir
    from tests.conftest import write_gz, write_tiny_multi30k

    source = write_tiny_multi30k(tmp_path / "multi30k")
    write_gz(source / "data/task1/raw/val.fr.gz", ["Un chat dort.", "Une ligne de trop."])
    workdir = tmp_path / "work"
    command = ["run", "ingest", "--workdir", str(workdir), "--dataset", "broken", "--source", str(source)]
    run = forker.run(command, tmp_path / "out.log", timeout=180, errors=tmp_path / "err.log")
    expected = (f"data/task1/raw/val.fr.gz has 2 lines but data/task1/image_splits/val.txt lists 1 images: "
                f"the files are not aligned (in {source})")  # fmt: skip
    assert run.returncode == 2
    assert "Traceback" not in run.stderr() + run.output()
    assert run.stderr().strip().splitlines()[-1] == f"mule: error: {expected}"

    client = MlflowClient(Workdir.at(workdir).mlflow_uri)
    experiment = client.get_experiment_by_name("mule/broken")
    ingest = [r for r in client.search_runs([experiment.experiment_id]) if r.info.run_name == "ingest"][0]
    assert ingest.info.status == "FAILED"
    assert ingest.data.tags["mule.error"] == expected and ingest.data.tags["mule.error_kind"] == "input"

    flow_run_id = ingest.data.tags["prefect.flow_run_id"]
    with get_client(sync_client=True) as prefect:
        state = prefect.read_flow_run(flow_run_id).state
    assert state.is_failed() and state.message == expected


def test_prefect_draining_its_queues_at_exit_says_nothing_after_mule_s_last_line(caplog):
    """Prefect's queue services log "Still processing items" when a command exits with an
    event not yet sent (seen once after `mule: error: ...` in the test above): not a line
    for the user. Their other warnings still show."""
    import logging

    from mule.flows.prefect_logs import quiet_user_errors

    quiet_user_errors()
    with caplog.at_level(logging.WARNING):
        for name in ("EventsWorker", "APILogWorker"):
            logging.getLogger(name).warning("Still processing items: 1 items remaining...")
            logging.getLogger(name).warning("Failed to send an item")
    assert [r.getMessage() for r in caplog.records] == ["Failed to send an item"] * 2


@pytest.mark.slow
def test_a_bug_keeps_its_traceback_exits_1_and_is_tagged_a_bug(tmp_path, forker):
    """An internal error inside a stage (here a FileNotFoundError for a path no user gave,
    injected where ingest writes its captions table) is not bad input: the traceback stays on
    the console and in Prefect's log, the exit code is 1, and MLflow says mule.error_kind=bug."""
    from mlflow.tracking import MlflowClient
    from prefect.client.orchestration import get_client

    from mule.storage.workdir import Workdir
    from tests.conftest import write_tiny_multi30k

    source = write_tiny_multi30k(tmp_path / "multi30k")
    workdir = tmp_path / "work"
    command = ["run", "ingest", "--workdir", str(workdir), "--dataset", "buggy", "--source", str(source)]
    run = forker.run(command, tmp_path / "out.log", timeout=180, errors=tmp_path / "err.log",
                     env={"MULE_BUG_AT": "write:captions/*"})  # fmt: skip
    output = run.stderr() + run.output()
    assert run.returncode == 1, output[-3000:]
    assert "mule: error:" not in output
    assert run.stderr().rstrip().splitlines()[-1].startswith("mule.storage.faults.InjectedBug: [Errno 2]")
    assert "in crash_point" in run.stderr()  # the frames that lead to the bug are there
    # the run's log keeps it too, with Prefect's lines of the failed task and flow run
    (log,) = (workdir / "logs").glob("*-run.log")
    assert "Traceback (most recent call last)" in log.read_text() and "prefect." in log.read_text()

    client = MlflowClient(Workdir.at(workdir).mlflow_uri)
    experiment = client.get_experiment_by_name("mule/buggy")
    ingest = [r for r in client.search_runs([experiment.experiment_id]) if r.info.run_name == "ingest"][0]
    assert ingest.info.status == "FAILED" and ingest.data.tags["mule.error_kind"] == "bug"
    with get_client(sync_client=True) as prefect:
        state = prefect.read_flow_run(ingest.data.tags["prefect.flow_run_id"]).state
    assert state.is_failed()


def test_serve_listens_on_this_machine_only_unless_told(capsys, tmp_path):
    args = build_parser().parse_args(["serve"])
    assert (args.host, args.port, args.dataset, args.max_upload_mb) == ("127.0.0.1", 8000, "embedded", 10.0)
    assert build_parser().parse_args(["serve", "--host", "0.0.0.0"]).host == "0.0.0.0"
    assert main(["serve", "--port", "0", "--workdir", str(tmp_path)]) == 2
    assert main(["serve", "--workdir", str(tmp_path)]) == 2  # nothing trained: one line, no traceback
    err = capsys.readouterr().err
    assert "--port must be between 1 and 65535" in err
    assert "no trained model in" in err


def test_mule_config_lists_the_presets_from_their_files(capsys):
    """The presets are data files (config/presets/*.toml); `mule config --list` names each
    with its summary, and a preset's file is what resolving it applies."""
    import tomllib

    from mule.commands.main import main
    from mule.config.presets import FOLDER, PRESETS
    from mule.config.resolution import resolve

    assert main(["config", "--list"]) == 0
    listed = [line.split()[0] for line in capsys.readouterr().out.splitlines()[:-1]]
    assert listed == sorted(p.stem for p in FOLDER.glob("*.toml")) == list(PRESETS)
    assert {"default", "demo", "few-photos", "paper"} <= set(listed)
    paper = tomllib.loads((FOLDER / "paper.toml").read_text())["set"]
    cfg = resolve("paper")
    assert cfg.model.mule_dim == paper["model.mule_dim"] == 512 and cfg.features.arch == paper["features.arch"]


def test_a_room_registers_what_a_stop_does_to_what_it_opens_when_it_opens_it(tmp_path, monkeypatch):
    """stopping/ holds the signal mechanics alone: installing the command's handlers
    registers nothing of the rooms above it. MLflow's room registers ending its runs KILLED
    when it opens the first (once, however many it opens), the flows' room marking its flow
    runs Crashed when it runs the first; a command that opened neither has nothing to end."""
    import types

    from mule.config.resolution import resolve
    from mule.experiments import tracking
    from mule.flows import open_runs
    from mule.stopping import command, interrupts
    from mule.storage.workdir import Workdir

    monkeypatch.setattr(interrupts, "_state", interrupts._State())
    monkeypatch.setattr(interrupts._State, "installed", True, raising=False)  # no handlers in the test process
    command.install_stop_handlers()
    assert interrupts._state.cleanups == [] and interrupts._state.at_exit == []
    wd, cfg = Workdir.at(tmp_path / "work"), resolve("demo", {})
    with tracking.run(wd, cfg, "one"), tracking.run(wd, cfg, "two"):
        assert interrupts._state.cleanups == [tracking._end_open_runs_killed]  # once
    context = types.SimpleNamespace(flow_run=types.SimpleNamespace(id="f-1"))
    monkeypatch.setattr("prefect.context.FlowRunContext.get", lambda: context)
    assert open_runs.inside(lambda: 7) == 7
    assert interrupts._state.cleanups == [tracking._end_open_runs_killed, open_runs._crash_on_stop]


def test_a_name_that_would_become_a_path_outside_the_workdir_is_refused_in_one_line(tmp_path, capsys):
    """--dataset given a folder says to use --source; a model or dataset name with a
    separator, `..` or an absolute path is refused naming the option, and nothing is written
    outside the workdir (before: `/path/photos.parquet` beside the folder, `x/model.pt` three
    folders up)."""
    photos = tmp_path / "photos"
    photos.mkdir()
    work = tmp_path / "deep" / "er" / "work"
    assert main(["run", "ingest", "--workdir", str(work), "--dataset", str(photos)]) == 2
    err = capsys.readouterr().err
    assert f"--dataset {photos} is a folder" in err and f"--dataset photos --source {photos}" in err
    assert main(["run", "train", "--workdir", str(work), "--set", "output.model_name=../../../x/model"]) == 2
    assert "output.model_name='../../../x/model' is a path: a name is letters, digits and" in capsys.readouterr().err
    for value in ("../x", "/etc/x", "a/b", "a\\b"):
        assert main(["search", "hello", "--workdir", str(work), "--dataset", value]) == 2
        assert f"--dataset={value!r} is a path" in capsys.readouterr().err
    assert main(["run", "train", "--workdir", str(work), "--set", "data.dataset=my shop"]) == 2
    assert "data.dataset='my shop' has characters a name cannot hold" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.rglob("*") if p.is_file() and "logs" not in p.parts) == []


def test_translation_pairs_are_read_as_languages_are_everywhere():
    """A region or script is kept (en-pt-BR); a side that names no language (en-xx), a
    pair with an underscore (written back in standard form) or of one language is refused."""
    import pytest

    from mule.config.resolution import resolve
    from mule.mule_core.settings import ConfigError

    cfg = resolve("demo", {"data.languages": "en,pt-BR", "translate.pairs": "en-pt-BR,pt-BR-en"})
    assert cfg.translate.pairs == ("en-pt-BR", "pt-BR-en")
    from mule.tasks.translate import language_pairs

    assert language_pairs(cfg) == [("en", "pt-BR"), ("pt-BR", "en")]
    for pairs, said in (("en-xx", "not 'src-dest' of two language codes"), ("en-pt_BR", "write 'en-pt_BR' as 'en-pt-BR'"),
                        ("en-en", "translates en into itself")):  # fmt: skip
        with pytest.raises(ConfigError, match=said):
            resolve("demo", {"data.languages": "en,pt-BR", "translate.pairs": pairs})
