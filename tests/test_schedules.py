"""The weekly rebuild really gets scheduled: a real `prefect server start` on loopback,
`prefect deploy` of prefect.yaml's rebuild deployment, and the server's scheduler
creating its Sunday 03:00 UTC runs.

This is what keeps the SQLAlchemy pin in pyproject.toml honest: under SQLAlchemy 2.1
Prefect 3.8's scheduler fails every loop and no run is ever created, so this test fails.
"""

from __future__ import annotations

import datetime
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

ROOT = Path(__file__).resolve().parents[1]
PREFECT = str(Path(sys.executable).with_name("prefect"))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def prefect_env(home: Path, api_url: str | None = None, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "MULE_"))}
    env.update(PREFECT_HOME=str(home), PREFECT_SERVER_ANALYTICS_ENABLED="false", DO_NOT_TRACK="true",
               PREFECT_LOGGING_LEVEL="WARNING", **extra)  # fmt: skip
    if api_url:
        env["PREFECT_API_URL"] = api_url
    return env


def wait_until(predicate, timeout: float, what: str, server: subprocess.Popen, log: Path):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        if server.poll() is not None:
            pytest.fail(f"the Prefect server exited while waiting for {what}:\n{log.read_text()[-3000:]}")
        time.sleep(1)
    pytest.fail(f"no {what} within {timeout:.0f}s; server log:\n{log.read_text()[-3000:]}")


@pytest.fixture
def prefect_server(tmp_path):
    home = tmp_path / "prefect-home"
    port = free_port()
    log = tmp_path / "server.log"
    env = prefect_env(home, PREFECT_UI_ENABLED="false", PREFECT_SERVER_SERVICES_LATE_RUNS_ENABLED="false",
                      PREFECT_SERVER_SERVICES_FOREMAN_ENABLED="false")  # fmt: skip
    with open(log, "wb") as out:
        server = subprocess.Popen([PREFECT, "server", "start", "--host", "127.0.0.1", "--port", str(port)],
                                  env=env, stdout=out, stderr=subprocess.STDOUT, cwd=tmp_path)  # fmt: skip
    api = f"http://127.0.0.1:{port}/api"

    def healthy() -> bool:
        try:
            return httpx.get(f"{api}/health", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    try:
        wait_until(healthy, 120, "healthy API", server, log)
        yield api, home, server, log
    finally:
        server.terminate()
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()


def cli(args: list[str], env: dict[str, str]) -> str:
    done = subprocess.run([PREFECT, *args], env=env, cwd=ROOT, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, f"prefect {' '.join(args)} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done.stdout


@pytest.mark.slow
def test_the_weekly_rebuild_gets_scheduled_runs(prefect_server, tmp_path):
    api, home, server, log = prefect_server
    workdir = tmp_path / "mule-home"
    env = prefect_env(home, api, MULE_REPO=str(ROOT), MULE_HOME=str(workdir))
    cli(["work-pool", "create", "mule-process", "--type", "process"], env)
    cli(["--no-prompt", "deploy", "--name", "weekly-rebuild"], env)

    deployment = httpx.get(f"{api}/deployments/name/rebuild/weekly-rebuild", timeout=10).json()
    # The workdir travels with the deployment, from MULE_HOME at deploy time.
    assert deployment["parameters"]["workdir"] == str(workdir)
    assert deployment["schedules"][0]["schedule"]["cron"] == "0 3 * * 0"
    assert deployment["job_variables"]["env"]["MULE_NICE"] == "10"  # its runs yield the CPU to `mule serve`

    def scheduled_runs() -> list[dict]:
        body = {"deployments": {"id": {"any_": [deployment["id"]]}},
                "flow_runs": {"state": {"type": {"any_": ["SCHEDULED"]}}}}  # fmt: skip
        return httpx.post(f"{api}/flow_runs/filter", json=body, timeout=10).json()

    runs = wait_until(scheduled_runs, 90, "scheduled run of rebuild/weekly-rebuild", server, log)
    for run in runs:
        when = datetime.datetime.fromisoformat(run["expected_start_time"]).astimezone(datetime.UTC)
        assert (when.weekday(), when.hour, when.minute) == (6, 3, 0)  # Sunday 03:00 UTC
        assert run["parameters"]["workdir"] == str(workdir)
    assert "InvalidRequestError" not in log.read_text()
