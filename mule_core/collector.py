"""Python's cyclic garbage collector paused while bulk data is built.

Reading a split of the real Multi30K text makes millions of small lists (377,000
captions' tokens, their ids, their padded rows), and each of CPython's full collections
walks every one of them, though none is garbage: `data_catalog.splits.load_split` took
10.8 s on the real training split, 3.3 s with the collector paused. The loaders that
build such data run inside `paused()`; reference counting still frees what they drop,
and what cyclic garbage they leave is collected once the pause ends. A pause begins with
a collection (at most one every COLLECT_EVERY_S): a training stage's model, optimiser and
weight average (GBs on the real text) can be garbage in cycles when the next stage starts
loading, and must not outlive its loading.

The pause is the process's (the collector has no other kind): several threads may hold
it at once (a stage's loaders and a Dask worker's), and it ends when the last lets go. A collector
someone else had switched off stays off.
"""

from __future__ import annotations

import functools
import gc
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from time import monotonic
from typing import TypeVar

_lock = threading.Lock()
_holders = 0
_enable_after = False
# A full collection costs 0.3 s in a process that has imported the pipeline: at most one
# every COLLECT_EVERY_S, so the loaders of one stage (the demo's text stage pauses eight
# times in 2 s) pay it once, and each stage of a real run (minutes apart) pays it.
COLLECT_EVERY_S = 30.0
_collected = [-COLLECT_EVERY_S]

F = TypeVar("F", bound=Callable)


@contextmanager
def paused() -> Iterator[None]:
    global _holders, _enable_after
    with _lock:
        if _holders == 0:
            _enable_after = gc.isenabled()
            if _enable_after and monotonic() - _collected[0] >= COLLECT_EVERY_S:
                gc.collect()  # what earlier work left in cycles (a finished stage's model and optimiser) goes first
                _collected[0] = monotonic()
            gc.disable()
        _holders += 1
    try:
        yield
    finally:
        with _lock:
            _holders -= 1
            if _holders == 0 and _enable_after:
                gc.enable()


def bulk(function: F) -> F:
    """`function` runs with the collector paused (a loader of bulk data)."""

    @functools.wraps(function)
    def with_collector_paused(*args, **kwargs):
        with paused():
            return function(*args, **kwargs)

    return with_collector_paused  # type: ignore[return-value]
