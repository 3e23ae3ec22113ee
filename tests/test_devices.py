"""Idle OpenMP threads sleep only when the machine is busy now (mule_core/devices.py)."""

import os
import subprocess
import sys
import textwrap

import pytest

from mule.mule_core.devices import cores_busy

STAT = textwrap.dedent("""\
    cpu  {busy} 0 0 {idle} 0 0 0 0 0 0
    cpu0 0 0 0 0 0 0 0 0 0 0
    cpu1 0 0 0 0 0 0 0 0 0 0
    intr 1 2 3
""")


class Ticking:
    """A /proc/stat whose counters move by (busy, idle) ticks each time it is read."""

    def __init__(self, tmp_path, busy: int, idle: int):
        self.path, self.step, self.reads = tmp_path / "stat", (busy, idle), 0
        self.write()

    def write(self) -> None:
        busy, idle = self.step
        self.path.write_text(STAT.format(busy=1000 + busy * self.reads, idle=5000 + idle * self.reads))
        self.reads += 1


def test_busy_cores_are_the_non_idle_share_times_the_cpus(tmp_path, monkeypatch):
    # 2 CPUs; over the window 30 busy and 10 idle ticks: 3/4 of 2 CPUs busy
    stat = Ticking(tmp_path, busy=30, idle=10)
    monkeypatch.setattr("time.sleep", lambda s: stat.write())
    assert cores_busy(stat=str(stat.path)) == pytest.approx(1.5)
    stat = Ticking(tmp_path, busy=0, idle=40)
    monkeypatch.setattr("time.sleep", lambda s: stat.write())
    assert cores_busy(stat=str(stat.path)) == 0.0


def test_unreadable_stat_is_unknown_not_idle(tmp_path):
    assert cores_busy(window_s=0.0, stat=str(tmp_path / "missing")) is None
    (tmp_path / "garbled").write_text("cpu x y\n")
    assert cores_busy(window_s=0.0, stat=str(tmp_path / "garbled")) is None


@pytest.mark.skipif(not os.path.exists("/proc/stat"), reason="Linux's /proc/stat")
def test_a_spinning_neighbour_counts_as_a_busy_core():
    spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        assert cores_busy(window_s=0.5) >= 0.5
    finally:
        spinner.kill()
        spinner.wait()


def _policy_chosen(env_extra: dict, spin: bool) -> str:
    code = ("from mule.mule_core.devices import idle_threads_sleep\nimport os\n"
            "idle_threads_sleep()\nprint(os.environ.get('OMP_WAIT_POLICY', '-'))")  # fmt: skip
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"} | env_extra
    spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"]) if spin else None
    try:
        return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                              check=True).stdout.strip()  # fmt: skip
    finally:
        if spinner:
            spinner.kill()
            spinner.wait()


@pytest.mark.skipif(not os.path.exists("/proc/stat"), reason="Linux's /proc/stat")
def test_threads_sleep_beside_a_busy_process_and_the_users_choice_wins():
    assert _policy_chosen({}, spin=True) == "PASSIVE"
    assert _policy_chosen({"OMP_WAIT_POLICY": "ACTIVE"}, spin=True) == "ACTIVE"


def test_the_machine_is_sampled_once_a_process(monkeypatch):
    from mule.mule_core import devices

    calls = []
    monkeypatch.setattr(devices, "cores_busy", lambda *a, **k: calls.append(1) or 0.0)
    monkeypatch.setattr(devices, "_SAMPLED", False)
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    monkeypatch.delitem(sys.modules, "torch", raising=False)
    devices.idle_threads_sleep()
    devices.idle_threads_sleep()  # the flows' call after the command's: decided already
    assert calls == [1] and "OMP_WAIT_POLICY" not in os.environ
    devices.idle_threads_sleep(always=True)  # a server sleeps its threads whatever was sampled
    assert os.environ.pop("OMP_WAIT_POLICY") == "PASSIVE"
