"""Stopping: Ctrl-C (SIGINT to the process group, as a terminal sends it) and SIGTERM
(what `timeout`, systemd or a container stop send) stop `mule demo` within seconds at
any stage, with one line and no traceback; the MLflow runs end KILLED, the Prefect flow
runs crashed; the same command then resumes and ends as a run never stopped. A second
run on the same workdir is refused with one line before it starts anything, or with
--wait waits for the first and reuses what it made.

bench/interrupts.py prints the same, stage by stage, with the seconds each took.
"""

from __future__ import annotations

import json
import os
import re
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.test_crashes import SIZES, TINY

pytestmark = pytest.mark.slow  # the whole file: it shares one fixture of tens of seconds, or runs real processes

REPO = Path(__file__).resolve().parents[1]
LIMIT_S = 3.0  # stopping.interrupts stops within 2 s; a loaded 2-core CI machine gets a second more
# a progress line of mule's own loggers: in the log's form, or as the console shows it ("09:58:45 fastText: ...")
PROGRESS = re.compile(r"\d\d:\d\d:\d\d(\.\d+ \| INFO +\| mule\.| (?!mule: )\S)")


class Demo:
    """`python -m mule.commands demo` as a user starts it (its own process group, its own
    temporary Prefect server unless PREFECT_API_URL says otherwise), its output collected;
    or, with `forker`, the same command forked from a process that has imported mule
    (tests/forked.py: the session's Prefect server, no imports to pay)."""

    def __init__(self, workdir: Path, *extra: str, env: dict | None = None, forker=None, script: str | None = None):
        args = ["demo", "--workdir", str(workdir), *SIZES, *[a for o in TINY for a in ("--set", o)], *extra]
        self.lines: list[str] = []
        if forker is not None:
            workdir.parent.mkdir(parents=True, exist_ok=True)
            log = workdir.parent / f"{workdir.name}-{time.monotonic_ns()}.log"
            self.process = forker.start(args, log, env=env, script=script)
            self.reader = threading.Thread(target=self._tail, args=(log,), daemon=True)
        else:
            self.process = subprocess.Popen([sys.executable, "-m", "mule.commands", *args], cwd=REPO, text=True,
                                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True,
                                            env={**os.environ, **(env or {})})  # fmt: skip
            self.reader = threading.Thread(target=lambda: self.lines.extend(self.process.stdout), daemon=True)
        self.reader.start()

    def _tail(self, log: Path) -> None:
        """The forked child's output file, line by line, until the child has ended."""
        while not log.exists() and self.process.poll() is None:
            time.sleep(0.02)
        with open(log, errors="replace") as handle:
            partial = ""
            while True:
                ended = self.process.poll() is not None
                chunk = handle.read()
                partial += chunk
                *complete, partial = partial.split("\n")
                self.lines.extend(line + "\n" for line in complete)
                if ended and not chunk:
                    if partial:
                        self.lines.append(partial)
                    return
                time.sleep(0.02)

    def wait_for(self, pattern: str, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        while not any(re.search(pattern, line) for line in self.lines):
            assert self.process.poll() is None, "".join(self.lines)[-3000:]
            assert time.monotonic() < deadline, f"no line matching {pattern!r}"
            time.sleep(0.02)

    def stop(self, signum: int, group: bool) -> tuple[float, list[str]]:
        """Sends the signal; (seconds until the process ended, lines printed after it)."""
        seen = len(self.lines)
        sent = time.monotonic()
        (os.killpg if group else os.kill)(self.process.pid, signum)
        self.process.wait(timeout=30)
        took = time.monotonic() - sent
        self.reader.join(5)
        return took, [line.rstrip("\n") for line in self.lines[seen:]]

    def finish(self, timeout: float = 300) -> str:
        self.process.wait(timeout=timeout)
        self.reader.join(5)
        return "".join(self.lines)


def runs(workdir: Path) -> list:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{workdir / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("mule/embedded")
    return client.search_runs([experiment.experiment_id]) if experiment else []


# `mule`'s entry point (forked: tests/forked.py) with each image shard 0.5 s slower: the tiny
# demo's 4 shards of 16 images at 32 px take hundredths of a second, so a signal sent when
# the stage says it ran could land after it ended (it did, once in a clean-clone run)
SLOW_SHARDS = r"""
import sys, time
import mule.tasks.features as features
real = features.extract_shard
def extract_shard(*args, **kwargs):
    time.sleep(0.5)
    return real(*args, **kwargs)
features.extract_shard = extract_shard
from mule.commands.main import entry
sys.argv = ["mule", *sys.argv[1:]]
entry()
"""


@pytest.mark.slow
def test_ctrl_c_and_sigterm_stop_every_kind_of_stage_and_the_rerun_equals_a_run_never_stopped(tmp_path,
        prefect_api_url, never_interrupted, forker):  # fmt: skip
    """The stop in evaluate hits a command started as a user starts it; those in features,
    text and train, and the run that resumes, are forked from a process that has imported
    mule (the same entry point, without the imports to pay). Evaluate at this size is over
    within a few hundredths of a second once its libraries are imported: a forked one can
    end before the signal lands."""
    from prefect.client.orchestration import get_client

    reference = never_interrupted
    stopped = tmp_path / "stopped"
    env = {"PREFECT_API_URL": prefect_api_url, "MULE_PREFECT_HEARTBEATS": "off"}  # the session's server: its states
    # stopping.interrupts' own lines ("[interrupts ...]": armed, the deadline and where the main thread was then),
    # kept out of what is checked and shown when a stop takes too long
    env["MULE_INTERRUPT_DEBUG"] = "1"
    for stage, signum, group in (("features", signal.SIGINT, True), ("text", signal.SIGTERM, False),
                                 ("train", signal.SIGINT, False), ("evaluate", signal.SIGTERM, True)):  # fmt: skip
        demo = Demo(stopped, env=env, forker=None if stage == "evaluate" else forker,
                    script=SLOW_SHARDS if stage == "features" else None)
        demo.wait_for(rf"^\d\d:\d\d:\d\d {stage}: ran\b")
        took, after = demo.stop(signum, group)
        debug = [line for line in after if line.startswith("[interrupts")]
        after = [line for line in after if not line.startswith("[interrupts")]
        *progress, said = [line for line in after if line.strip()] or [""]
        assert demo.process.returncode == 128 + signum, (stage, after)
        if took >= LIMIT_S:  # in full under "Captured stdout" (pytest cuts a long assertion message)
            print(f"{stage} stopped in {took:.2f} s", *debug, *after, sep="\n")
        assert took < LIMIT_S, (stage, took, debug, after)
        # mule's one line last; before it at most the stage's own progress, printed before the signal landed
        assert said.startswith(f"mule: stopped by {'Ctrl-C' if signum == 2 else 'SIGTERM'}"), after
        assert all(PROGRESS.match(line) for line in progress), after
        assert f"in stage {stage};" in said and "run the same command to resume" in said, said
        everything = "".join(demo.lines)
        assert "Traceback" not in everything and "ConnectError" not in everything
        open_runs = [r.info.run_name for r in runs(stopped) if r.info.status == "RUNNING"]
        assert not open_runs, (stage, open_runs)
        killed = [r for r in runs(stopped) if r.info.status == "KILLED"]
        assert {r.info.run_name for r in killed} >= {stage, "rebuild"}, (
            stage, [(r.info.run_name, r.info.status, r.data.tags.get("mule.error")) for r in runs(stopped)],
            everything[-4000:])  # fmt: skip
        with get_client(sync_client=True) as client:  # the stage's flow run, as Prefect's UI shows it
            flow_run = client.read_flow_run(
                next(r for r in killed if r.info.run_name == stage).data.tags["prefect.flow_run_id"]
            )
            assert flow_run.state.type.value in ("CRASHED", "CANCELLED"), (stage, flow_run.state)

    output = Demo(stopped, env=env, forker=forker).finish()
    assert "mean mR" in output, output[-3000:]
    evaluation = [json.loads((w / "results" / "embedded" / "evaluation.json").read_text())["table"]
                  for w in (stopped, reference)]  # fmt: skip
    assert evaluation[0] == evaluation[1]  # the resumed run is the run never stopped


def signalled(script: str, signum: int, settle: float = 0.0, env: dict | None = None) -> tuple[str, float, int, str]:
    """`script` in a fresh interpreter, sent `signum` `settle` seconds after its first line:
    (that line, seconds from the signal to its end, exit code, the rest of its output)."""
    process = subprocess.Popen([sys.executable, "-c", script], cwd=REPO, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True, env=env)  # fmt: skip
    first = process.stdout.readline().strip()
    time.sleep(settle)
    sent = time.monotonic()
    process.send_signal(signum)
    rest = process.communicate(timeout=60)[0]
    return first, time.monotonic() - sent, process.returncode, rest


def training_in_c(corpus: Path) -> str:
    """Script lines that write a corpus fastText needs seconds per epoch on, then `path` names it."""
    return (f"path = {str(corpus)!r}\n"
            "words = [f'w{i}' for i in range(2000)]\n"
            "open(path, 'w').write('\\n'.join(' '.join(random.choices(words, k=12)) for _ in range(200_000)))\n")  # fmt: skip


def test_a_signal_while_c_code_runs_still_stops_within_the_grace(tmp_path):
    """fastText trains in C for seconds without coming back to Python, where Ctrl-C's
    exception would be raised: the watchdog ends the process all the same."""
    script = (
        "import random, sys, fasttext\n"
        "from mule.stopping import interrupts\n"
        "interrupts.install(lambda signum: 'mule: stopped by ' + interrupts.how(signum))\n"
        + training_in_c(tmp_path / "corpus.txt") +
        "print('training', flush=True)\n"
        "fasttext.train_unsupervised(path, dim=100, epoch=50, thread=1, verbose=0)\n"
        "print('trained: the signal was not acted on', flush=True)\n"
    )  # fmt: skip
    first, took, code, rest = signalled(script, signal.SIGINT, settle=0.5)
    assert first == "training"
    assert took < LIMIT_S and code == 130, rest
    assert rest.strip() == "mule: stopped by Ctrl-C"


def test_a_flow_run_stopped_while_c_code_runs_ends_crashed_not_running(tmp_path, prefect_api_url):
    """The main thread in fastText cannot unwind, so Prefect never marks the flow run: the
    stop's cleanup does, as Prefect marks one that unwinds (it would stay Running for good:
    mule's flows have no heartbeats)."""
    from prefect.client.orchestration import get_client

    script = (
        "import random, fasttext\n"
        "from prefect import flow\n"
        "from prefect.context import FlowRunContext\n"
        "from mule.stopping.command import install_stop_handlers\n"
        "from mule.flows.stages import _failing_quietly\n"
        "install_stop_handlers()\n"
        + training_in_c(tmp_path / "corpus.txt") +
        "def body():\n"
        "    print(FlowRunContext.get().flow_run.id, flush=True)\n"
        "    fasttext.train_unsupervised(path, dim=100, epoch=50, thread=1, verbose=0)\n"
        "flow(name='c-code')(lambda: _failing_quietly(body))()\n"
    )  # fmt: skip
    env = {**os.environ, "PREFECT_API_URL": prefect_api_url, "MULE_PREFECT_HEARTBEATS": "off"}
    flow_run_id, took, code, rest = signalled(script, signal.SIGINT, settle=0.5, env=env)
    assert took < LIMIT_S and code == 130, flow_run_id + rest
    assert rest.strip().splitlines()[-1] == "mule: stopped by Ctrl-C"
    with get_client(sync_client=True) as client:
        state = client.read_flow_run(flow_run_id).state
    assert state.type.value == "CRASHED" and state.message == "mule was stopped by Ctrl-C", state


def test_a_failure_a_signal_causes_before_the_watchdog_knows_is_not_logged():
    """While a flow runs, Prefect's SIGTERM handler raises in the main thread, and a DuckDB
    query turns that into RuntimeError('Query interrupted'): Prefect logs the task run as
    failed, with its traceback, before the watchdog's thread has run. That line is left
    out: the one line says what happened."""
    script = (
        "import logging, os, signal, sys, time\n"
        "from mule.stopping import interrupts\n"
        "from mule.flows.prefect_logs import quiet_user_errors\n"
        "interrupts.install(lambda signum: 'mule: stopped by ' + interrupts.how(signum))\n"
        "logging.basicConfig(stream=sys.stdout, level=logging.INFO)\n"
        "quiet_user_errors()\n"
        "def prefects(signum, frame):\n"  # in front of mule's handler, as during a flow run
        "    raise RuntimeError('Query interrupted')\n"
        "signal.signal(signal.SIGTERM, prefects)\n"
        "logging.getLogger('prefect.task_runs').error('Task run failed with a genuine error', exc_info=ValueError('x'))\n"
        "try:\n"
        "    os.kill(os.getpid(), signal.SIGTERM)\n"
        "    time.sleep(5)\n"
        "except RuntimeError:\n"
        "    logging.getLogger('prefect.task_runs').error('Task run failed with exception', exc_info=True)\n"
        "while True:\n"
        "    time.sleep(0.05)\n"
    )
    process = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert process.returncode == 143, process.stdout + process.stderr
    output = process.stdout + process.stderr
    assert "genuine error" in output and "ValueError: x" in output  # no stop: logged as ever
    assert "Task run failed with exception" not in output and "Query interrupted" not in output, output
    assert output.strip().splitlines()[-1] == "mule: stopped by SIGTERM"


def test_a_signal_that_lands_in_a_finaliser_stops_the_command_with_its_one_line():
    """Python cannot raise a signal's exception inside a finaliser (or a weakref callback,
    as the garbage collector runs them): it prints "Exception ignored" and goes on. The
    watchdog stops the process, and the traceback is not shown."""
    script = (
        "import time\n"
        "from mule.stopping import interrupts\n"
        "interrupts.install(lambda signum: 'mule: stopped by ' + interrupts.how(signum))\n"
        "class Slow:\n"
        "    def __del__(self):\n"
        "        time.sleep(0.2)\n"  # where the signal lands
        "print('working', flush=True)\n"
        "while True:\n"
        "    Slow()\n"
    )
    first, took, code, rest = signalled(script, signal.SIGTERM, settle=0.1)
    assert first == "working"
    assert code == 143 and took < LIMIT_S, rest
    assert rest.strip() == "mule: stopped by SIGTERM"


# swallow_a_stop(): SIGTERM lands in a weakref callback (the callback sends it), where Python
# prints the signal's exception away instead of raising it
STOP_IN_A_CALLBACK = (
    "import os, signal, time, weakref\n"
    "class Node:\n"
    "    pass\n"
    "def callback(ref):\n"
    "    os.kill(os.getpid(), signal.SIGTERM)\n"
    "    time.sleep(0.2)\n"
    "def swallow_a_stop():\n"
    "    node = Node()\n"
    "    ref = weakref.ref(node, callback)\n"
    "    del node\n"  # the callback runs here
)


def test_a_stop_a_weakref_callback_swallowed_is_raised_again_in_the_main_thread():
    """While a flow runs, Prefect's SIGTERM handler raises TerminationSignal wherever the main
    thread is: in the text stage it landed in a WeakValueDictionary's callback, where Python
    prints it away, and the stage waited on until the watchdog's deadline (2-3.6 s in all).
    The stop is raised again, as it was, once the main thread is out of the callback: the
    code in hand unwinds (its `except` runs), the watchdog does not have to end it."""
    script = (
        "import signal, threading\n"
        "from prefect.exceptions import TerminationSignal\n"
        "from mule.stopping import interrupts\n"
        "interrupts.install(lambda signum: 'mule: stopped by ' + interrupts.how(signum))\n"
        "def prefects(signum, frame):\n"  # in front of mule's handler, as during a flow run
        "    raise TerminationSignal(signal=signum)\n"
        "signal.signal(signal.SIGTERM, prefects)\n"
        + STOP_IN_A_CALLBACK +
        "try:\n"
        "    swallow_a_stop()\n"
        "    print('swallowed', flush=True)\n"
        "    while True:\n"  # what the stage does next: waits in short turns
        "        threading.Event().wait(0.1)\n"
        "except TerminationSignal as stop:\n"
        "    print('unwound:', type(stop).__name__, stop.signal, flush=True)\n"
        "    raise SystemExit(interrupts.finish(stop.signal))\n"
    )
    process = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert process.returncode == 143, process.stdout + process.stderr
    assert process.stdout.splitlines() == ["swallowed", "unwound: TerminationSignal 15"], process.stdout
    assert process.stderr.strip() == "mule: stopped by SIGTERM", process.stderr


def test_a_swallowed_stop_is_raised_again_only_once_an_import_in_hand_is_done(tmp_path):
    """Raised inside an import, the stop would leave a module half made, which the next
    import of it can turn into an abort (torch registering its C++ types twice): it waits
    until the main thread is out of the import."""
    (tmp_path / "slow_module.py").write_text(
        "import time\n"
        + STOP_IN_A_CALLBACK +
        "swallow_a_stop()\n"  # in the middle of this import
        "for _ in range(10):\n"  # short: the watchdog's 1.5 s hold a loaded host's slowness too
        "    time.sleep(0.01)\n"  # the rest of the import: Python code, where an async exception lands
        "done = True\n"
    )
    script = (
        "import sys, threading\n"
        f"sys.path.insert(0, {str(tmp_path)!r})\n"
        "from mule.stopping import interrupts\n"
        "interrupts.install(lambda signum: 'mule: stopped by ' + interrupts.how(signum))\n"
        "try:\n"
        "    import slow_module\n"
        "    print('imported', slow_module.done, flush=True)\n"
        "    while True:\n"
        "        threading.Event().wait(0.1)\n"
        "except KeyboardInterrupt as stop:\n"
        "    print('unwound, the module whole:', getattr(sys.modules.get('slow_module'), 'done', False), flush=True)\n"
        "    raise SystemExit(interrupts.finish(stop.signum))\n"
    )
    process = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert process.returncode == 143, process.stdout + process.stderr
    # the import ended whole before the stop landed; where after it (inside the print, on a
    # loaded host: "importedunwound, ...") is not the point
    assert process.stdout.startswith("imported"), process.stdout
    assert process.stdout.rstrip().endswith("unwound, the module whole: True"), process.stdout


def test_a_stop_while_a_stage_s_mlflow_run_is_set_up_ends_it_killed(tmp_path, monkeypatch):
    """The run exists from create_run on; its config is logged after. A stop in between
    left it RUNNING for good."""
    from mule.config.resolution import resolve
    from mule.experiments import tracking
    from mule.stopping.interrupts import Interrupted
    from mule.storage.workdir import Workdir

    def stopped(self, params) -> None:
        raise Interrupted(signal.SIGTERM)

    monkeypatch.setattr(tracking.Tracker, "params", stopped)
    wd = Workdir.at(tmp_path)
    with pytest.raises(Interrupted):
        with tracking.run(wd, resolve("demo", {}), "index"):
            pass
    [run] = tracking.find_runs(wd, "embedded")
    assert run.info.run_name == "index" and run.info.status == "KILLED"
    assert run.info.run_id not in tracking._open_runs


def test_a_cleanup_that_hangs_does_not_keep_a_stopped_command_alive():
    """Ending the MLflow runs or stopping Prefect's server can hang (an SQLite store another
    process holds): the cleanups get CLEANUP_S in all, the one line comes out, the process ends."""
    script = (
        "import time\n"
        "from mule.stopping import interrupts\n"
        "interrupts.install(lambda signum: 'mule: stopped by ' + interrupts.how(signum))\n"
        "interrupts.on_stop(lambda: time.sleep(600))\n"
        "try:\n"  # before 'working': the signal may land the moment the line is out
        "    print('working', flush=True)\n"
        "    while True:\n"
        "        time.sleep(0.05)\n"
        "except interrupts.Interrupted as stop:\n"  # as the command does (commands/main.py: entry)
        "    raise SystemExit(interrupts.finish(stop.signum))\n"
    )
    from mule.stopping.interrupts import CLEANUP_S

    first, took, code, rest = signalled(script, signal.SIGTERM)
    assert first == "working"
    assert code == 143 and took < CLEANUP_S + LIMIT_S, rest
    assert rest.strip() == "mule: stopped by SIGTERM"


@pytest.mark.slow
def test_a_second_run_is_refused_at_once_or_waits_for_the_first(tmp_path, forker):
    workdir = tmp_path / "work"
    first = Demo(workdir)  # its own temporary Prefect server, as a user's first run
    first.wait_for(r"^\d\d:\d\d:\d\d ingest: ran\b")

    started = time.monotonic()
    refused = Demo(workdir, env={"MULE_PREFECT_EARLY_START": "1"})
    output = refused.finish(timeout=60).strip()
    assert refused.process.returncode == 2 and time.monotonic() - started < 15
    assert len(output.splitlines()) == 1 and "in use by another mule process" in output, output
    assert f"pid {first.process.pid}" in output and "--wait" in output

    waiting = Demo(workdir, "--wait", forker=forker)  # forked: the session's Prefect server
    waiting.wait_for(rf"waiting for the workdir .* in use by pid {first.process.pid}")
    assert "mean mR" in first.finish()
    second = waiting.finish()
    assert waiting.process.returncode == 0, second[-3000:]
    assert "every stage is up to date" in second  # it ran once the first was done, reusing what it made
    assert "Traceback" not in second and "ConnectError" not in second


def test_a_signal_while_prefect_is_still_making_a_task_run_stops_as_any_other(tmp_path, prefect_api_url):
    """Prefect 3 answers a KeyboardInterrupt that lands before its task run exists with
    `ValueError: Task run is not set` (its crash handler has nothing to mark): the stop
    is still one line and 143, and the stage's flow run ends crashed. The signal is sent
    from inside Prefect's task-run set-up, so it lands there every time."""
    script = (
        "import os, signal, sys\n"
        "import prefect.task_engine as engine\n"
        "collect = engine.collect_task_run_inputs_sync\n"
        "def collect_then_stop(value, *args, **kwargs):\n"
        "    engine.collect_task_run_inputs_sync = collect\n"
        "    os.kill(os.getpid(), signal.SIGTERM)\n"
        "    return collect(value, *args, **kwargs)\n"
        "engine.collect_task_run_inputs_sync = collect_then_stop\n"
        "from mule.commands import main\n"
        f"sys.argv = ['mule', 'demo', '--workdir', {str(tmp_path / 'work')!r}, *{SIZES!r}]\n"
        "main.entry()\n"
    )
    env = {**os.environ, "PREFECT_API_URL": prefect_api_url, "MULE_PREFECT_HEARTBEATS": "off"}
    process = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, env=env,
                             timeout=120)  # fmt: skip
    output = process.stdout + process.stderr
    assert process.returncode == 143, output[-3000:]
    assert "Traceback" not in output, output[-3000:]
    said = [line for line in process.stderr.splitlines() if line.startswith("mule:")]
    assert said and said[-1].startswith("mule: stopped by SIGTERM") and "in stage ingest" in said[-1], output[-3000:]
    from prefect.client.orchestration import get_client

    killed = {r.info.run_name: r for r in runs(tmp_path / "work") if r.info.status == "KILLED"}
    assert {"ingest", "rebuild"} <= set(killed), sorted(killed)
    with get_client(sync_client=True) as client:
        flow_run = client.read_flow_run(killed["ingest"].data.tags["prefect.flow_run_id"])
        assert flow_run.state.type.value in ("CRASHED", "CANCELLED"), flow_run.state


def test_an_error_the_stop_causes_ends_the_stage_s_mlflow_run_killed_not_failed(tmp_path, monkeypatch):
    """DuckDB turns a Ctrl-C that lands mid-query into RuntimeError('Query interrupted'),
    without the KeyboardInterrupt: once a stop signal came (stopping.interrupts armed), the
    stage's run ends KILLED all the same (a stop in train's first query left it FAILED)."""
    import duckdb

    from mule.config.resolution import resolve
    from mule.experiments import tracking
    from mule.stopping import interrupts
    from mule.storage.workdir import Workdir

    wd = Workdir.at(tmp_path)
    monkeypatch.setattr(interrupts._state, "armed", signal.SIGINT)  # what interrupts' handler does first
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)  # pytest may have its own
    try:
        with pytest.raises(RuntimeError, match="Query interrupted"):
            with tracking.run(wd, resolve("demo"), "train") as run_id:
                query = duckdb.connect(config={"threads": 1})  # one core spins until the signal
                threading.Timer(0.2, signal.pthread_kill, (threading.main_thread().ident, signal.SIGINT)).start()
                query.execute("select count(*) from range(100000000000) a").fetchall()
    finally:
        signal.signal(signal.SIGINT, previous)
    run = tracking.client(wd).get_run(run_id)
    assert (run.info.status, run.data.tags["mule.error_kind"]) == ("KILLED", "interrupted")


def _read_a_row_then_stop(database: Path) -> None:
    rows = sqlite3.connect(database).execute("SELECT key FROM params")  # the statement stays open: a read lock
    assert rows.fetchone() is not None
    raise KeyboardInterrupt


def test_a_stop_that_lands_while_rows_are_read_does_not_keep_the_run_from_ending(tmp_path):
    """A stop that lands while a query's rows are read keeps that cursor, and SQLite's read
    lock with it, in the frames it went through (Python's sqlite3 does not reset a statement
    on rollback). Ending the run KILLED must not wait for it: under the suite's load a commit
    waited on such a lock, and stopping evaluate took 3.6-4.6 s instead of under one."""
    from mule.config.resolution import resolve
    from mule.experiments import tracking
    from mule.storage.workdir import Workdir

    wd = Workdir.at(tmp_path)
    started = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        with tracking.run(wd, resolve("demo"), "evaluate") as run_id:
            _read_a_row_then_stop(wd.root / "mlflow.db")
    run = tracking.client(wd).get_run(run_id)
    assert (run.info.status, run.data.tags["mule.error_kind"]) == ("KILLED", "interrupted")
    assert time.monotonic() - started < 10  # SQLite's busy timeout in MLflow's store is 20 s
