"""What a stop does to a `mule` command: Ctrl-C and SIGTERM end it with one line (the
handlers of interrupts.py). What a stop does to what a command opened is registered by the
room that opens it, when it does (stopping.interrupts.on_stop): experiments/tracking.py
ends its MLflow runs KILLED, flows/open_runs.py marks its Prefect flow runs Crashed,
flows/prefect_logs.py skips Prefect's log drain at exit. This room reaches none of them."""

from __future__ import annotations


def install_stop_handlers() -> None:
    """Ctrl-C and SIGTERM stop the command with one line (stopping.interrupts)."""
    from mule.stopping import interrupts

    interrupts.install(lambda signum: f"mule: stopped by {interrupts.how(signum)}")
