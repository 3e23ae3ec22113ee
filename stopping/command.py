"""What a stop does to a `mule` command: Ctrl-C and SIGTERM end it with one line (the
handlers of interrupts.py), the MLflow runs and Prefect flow runs it left open are ended
KILLED and Crashed, and Prefect's log drain at exit is skipped. The higher rooms are found
among the modules already imported (a command that never imported MLflow has no run to
end), never imported from here."""

from __future__ import annotations

import sys


def _end_open_mlflow_runs() -> None:
    """MLflow runs still open when a signal ends the process before they could unwind: KILLED."""
    tracking = sys.modules.get("mule.experiments.tracking")
    if tracking is not None:
        tracking.end_open_runs("KILLED")


def _crash_open_flow_runs() -> None:
    """Prefect flow runs still Running when a signal ends the process before they could
    unwind: Crashed, as Prefect marks those that do."""
    open_runs = sys.modules.get("mule.flows.open_runs")
    if open_runs is not None:
        import signal

        from mule.stopping import interrupts

        open_runs.crash_open(f"mule was stopped by {interrupts.how(interrupts.stopping() or signal.SIGINT)}")


def install_stop_handlers() -> None:
    """Ctrl-C and SIGTERM stop the command with one line, its MLflow and Prefect runs ended
    (stopping.interrupts)."""
    from mule.stopping import interrupts

    interrupts.install(lambda signum: f"mule: stopped by {interrupts.how(signum)}")
    interrupts.on_stop(_end_open_mlflow_runs)
    interrupts.on_stop(_crash_open_flow_runs)


def skip_prefect_log_drain() -> None:
    """After a stop, Prefect's exit handler would wait up to 5 s for its log worker to ship
    the last lines to its API (logging.shutdown flushes every handler): the stop's 2 s went
    to it (1.5 s, then the watchdog ended the process). The one line says what happened and
    the flow run is marked crashed already; what the run logged before the signal was shipped
    as it went."""
    import logging

    handlers = sys.modules.get("prefect.logging.handlers")
    if handlers is None:
        return
    for ref in list(getattr(logging, "_handlerList", [])):  # every handler logging.shutdown flushes
        handler = ref()
        if isinstance(handler, handlers.APILogHandler):
            handler.flush = lambda: None
