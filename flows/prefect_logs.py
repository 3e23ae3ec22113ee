"""What Prefect's loggers may print: a user error without its traceback, no crash lines for
a stop (mule's one line says it), no queue-drain notices at exit."""

from __future__ import annotations

import logging


class _NoTracebackForUserErrors(logging.Filter):
    """Prefect logs a failed task or flow run with the exception's traceback; for a user
    error (mule_core.errors) the message is the whole story."""

    def filter(self, record: logging.LogRecord) -> bool:
        from mule.mule_core.errors import is_user_error

        if record.exc_info and record.exc_info[1] is not None and is_user_error(record.exc_info[1]):
            record.exc_info = None
            record.exc_text = None
        return True


class _NoCrashLinesForSignals(logging.Filter):
    """Prefect reports a run stopped by Ctrl-C or SIGTERM as crashed ("Execution was aborted
    by an interrupt signal"), or as failed with whatever the signal's exception became (a
    DuckDB query's "Query interrupted"), sometimes before mule's handler has seen the
    signal: mule's one line (stopping.interrupts) says it; the flow run's state still does in
    Prefect. A failure logged with its exception waits up to 0.1 s to learn whether a stop
    caused it (only in a command, where the handlers are installed)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if "Execution was aborted by a" in record.getMessage():
            return False
        if record.levelno >= logging.ERROR and record.exc_info:
            from mule.stopping import interrupts

            return not interrupts.stopping_soon()
        return True


class _NoDrainNotices(logging.Filter):
    """At a command's exit Prefect drains its queues of events and logs to the API, and a
    queue with an item still in it says "Still processing items: 1 items remaining..." at
    WARNING, however briefly: printed after mule's last line (its error or its stop), it
    would read as a problem of its own."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("Still processing items")


def skip_log_drain() -> None:
    """After a stop, Prefect's exit handler would wait up to 5 s for its log worker to ship
    the last lines to its API (logging.shutdown flushes every handler): the stop's 2 s went
    to it (1.5 s, then the watchdog ended the process). The one line says what happened and
    the flow run is marked crashed already; what the run logged before the signal was shipped
    as it went."""
    from prefect.logging.handlers import APILogHandler

    for ref in list(getattr(logging, "_handlerList", [])):  # every handler logging.shutdown flushes
        handler = ref()
        if isinstance(handler, APILogHandler):
            handler.flush = lambda: None


def quiet_user_errors() -> None:
    """Installs the filters on Prefect's run loggers and its queue services' (idempotent;
    Prefect may reconfigure logging), and registers what a stop does to Prefect's log drain
    (stopping.interrupts.at_stopped_exit: skipped)."""
    from mule.stopping import interrupts

    interrupts.at_stopped_exit(skip_log_drain, key="prefect log drain")
    for name in ("prefect.task_runs", "prefect.flow_runs", "prefect.flow_engine", "prefect.task_engine",
                 "prefect.engine"):  # fmt: skip
        logger = logging.getLogger(name)
        for kind in (_NoTracebackForUserErrors, _NoCrashLinesForSignals):
            if not any(isinstance(f, kind) for f in logger.filters):
                logger.addFilter(kind())
    for name in ("EventsWorker", "APILogWorker"):  # prefect._internal.concurrency.services: the class's name
        logger = logging.getLogger(name)
        if not any(isinstance(f, _NoDrainNotices) for f in logger.filters):
            logger.addFilter(_NoDrainNotices())
