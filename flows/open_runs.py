"""The Prefect flow runs this process is in, so that a stop marks them crashed even when
the main thread cannot unwind in time (a fastText epoch or one long batch in C): the
watchdog of stopping.interrupts then ends the process, and without this their state would
stay Running in Prefect's UI for good (mule's flows run without heartbeats)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

_open: dict[str, None] = {}  # flow run ids, outermost first
_lock = threading.Lock()


def inside(body: Callable[[], T]) -> T:
    """body(), the current flow run recorded as open while it runs. A stop leaves it
    recorded: Prefect marks it crashed as the stop unwinds, or crash_open() does."""
    from prefect.context import FlowRunContext

    from mule.stopping.interrupts import stopping

    context = FlowRunContext.get()
    flow_run_id = str(context.flow_run.id) if context is not None and context.flow_run is not None else None
    if flow_run_id is not None:
        with _lock:
            _open[flow_run_id] = None
        from mule.stopping import interrupts

        interrupts.on_stop(_crash_on_stop, key="flow runs")  # a stop marks what this room opened
    try:
        return body()
    finally:
        if flow_run_id is not None and stopping() is None:
            with _lock:
                _open.pop(flow_run_id, None)


def _crash_on_stop() -> None:
    """A stop's cleanup: the open flow runs Crashed, as Prefect marks those that unwind."""
    import signal

    from mule.stopping import interrupts

    crash_open(f"mule was stopped by {interrupts.how(interrupts.stopping() or signal.SIGINT)}")


def crash_open(message: str) -> list[str]:
    """Marks Crashed the recorded flow runs that are still Running, innermost first (a stop's
    cleanup: stopping.interrupts.on_stop); returns their ids."""
    with _lock:
        ids = list(reversed(_open))
        _open.clear()
    if not ids:
        return []
    from prefect.client.orchestration import get_client
    from prefect.states import Crashed

    crashed = []
    with get_client(sync_client=True) as client:
        for flow_run_id in ids:
            state = client.read_flow_run(flow_run_id).state
            if state is not None and state.is_running():
                client.set_flow_run_state(flow_run_id, Crashed(message=message), force=True)
                crashed.append(flow_run_id)
    return crashed
