"""Stages side by side: a stage whose inputs are written runs beside the stage in hand.

The rebuild's stages form a graph (pipeline.declaration: who writes what each reads), not a
line: `features` reads only ingest's image list, so it need not wait for `translate`,
`text` and LP, and `index` need not wait for `evaluate`. `run_stages` walks the plan in
order on the calling thread (the main lane) and starts the first stage further on whose
inputs are all written on a second thread (the side lane), one at a time:

    ingest | translate, text, pretrain | train | evaluate
           | features                  |       | index

The cores are shared, never oversubscribed (two torch pools on two cores stall each other:
training ran 40 times slower beside another run): while both lanes compute, the side lane
has half the cores and the main lane the rest (mule_core.devices.share_cores: stages size
their pools and torch's threads from their share; the text stage's fastText jobs and
features' ONNX slices follow it as it changes), and once the main lane waits for the side
lane, the side lane has them all.

Each stage is still decided, locked, computed, recorded and published by the runner as
alone (pipeline.runner); each is still a Prefect task run of the flow (its context is
carried to the side lane's thread) and an MLflow run. Console lines of either lane carry
their stage's name (mule_core.progress.lane_of). A stage that fails or a stop: Ctrl-C
raises in the main thread, the side lane is stopped the same way (a KeyboardInterrupt
raised in its thread at its next Python line) and both keep what they finished; an error
in one lane lets the other finish the stage it is on, then the run fails with it.

Off with `mule run --sequential` (the flows' `sequential` parameter), on a single core,
and for plans with a sweep (whose steps run stages themselves).
"""

from __future__ import annotations

import contextlib
import contextvars
import ctypes
import logging
import sys
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor

from mule.experiments.tracking import let_go
from mule.mule_core import devices
from mule.mule_core.progress import SHOWN, in_lane
from mule.pipeline.declaration import BY_NAME, writer_of
from mule.storage import locks

JOIN_S = 0.2  # how long a stopped side lane is waited for (the watchdog ends the process 1.5 s after the signal)


def needs(stages: Sequence[str], cfg) -> dict[str, set[str]]:
    """For each planned stage, the planned stages that write what it reads."""
    planned = set(stages)
    return {s: {w for e in BY_NAME[s].entries_read(cfg) if (w := writer_of(e)) in planned and w != s} for s in stages}


def side_by_side(stages: Sequence[str], sequential: bool) -> bool:
    """Whether a plan's stages may run two at once here."""
    return not sequential and devices.machine_cores() >= 2 and all(BY_NAME[s].kind != "sweep" for s in stages)


def run_stages(stages: Sequence[str], cfg, run_one: Callable[[str], None], sequential: bool = False) -> None:
    """run_one(stage) for every stage, each after the stages it reads from; two at once
    where the plan allows (see the module's docstring), else in order."""
    if not side_by_side(stages, sequential):
        for stage in stages:
            run_one(stage)
        return
    Lanes(list(stages), needs(stages, cfg), run_one).run()


class Lanes:
    def __init__(self, stages: list[str], needs: dict[str, set[str]], run_one: Callable[[str], None]):
        self.pending, self.needs, self.run_one = stages, needs, run_one
        self.done: set[str] = set()
        self.side: tuple[str, Future, list[int]] | None = None  # stage, its future, its thread's ident
        self.pool = ThreadPoolExecutor(1, thread_name_prefix="mule-side-lane")
        self.cores = devices.machine_cores()
        self.main = threading.get_ident()
        self.torch_threads: int | None = None  # the main thread's, while its share lowered them
        self.in_hand: str | None = None  # the main lane's stage (what failed, when the main lane raises)

    def run(self) -> None:
        try:
            while self.pending or self.side:
                self._collect()
                if not self.pending and self.side is None:
                    break
                ready = [s for s in self.pending if self.needs[s] <= self.done]
                if not ready and self.side is not None:  # the main lane waits for the side lane: all cores to it
                    stage, future, ident = self.side
                    if ident:
                        devices.share_cores(ident[0], self.cores)
                    logger().info("waiting for %s (beside it) to finish", stage)
                    future.exception()
                    continue
                stage = ready[0] if ready else self.pending[0]
                self.pending.remove(stage)
                self.in_hand = stage
                if self.side is None:
                    self._start_side(next((s for s in ready[1:]), None), stage)
                beside = self._share_main()
                with in_lane(stage) if beside else contextlib.nullcontext():  # lines say their stage while two run
                    self.run_one(stage)
                self.done.add(stage)
                self.in_hand = None
        except BaseException as error:
            self._stop_side(error)
            raise
        finally:
            devices.share_cores(self.main, None)
            if self.torch_threads is not None:
                _torch().set_num_threads(self.torch_threads)
            self.pool.shutdown(wait=False)

    def _collect(self) -> None:
        """The side lane's stage, once it ended: done, or its error raised here."""
        if self.side is None or not self.side[1].done():
            return
        stage, future, _ = self.side
        self.side = None
        error = future.exception()
        if error is not None:
            raise error
        self.done.add(stage)

    def _start_side(self, stage: str | None, beside: str) -> None:
        if stage is None:
            return
        self.pending.remove(stage)
        share = max(1, self.cores // 2)
        ident: list[int] = []
        context = contextvars.copy_context()  # Prefect's flow run, for the stage's task run

        def lane() -> None:
            ident.append(threading.get_ident())
            devices.share_cores(ident[0], share)
            locks.set_lane(stage)
            try:
                with in_lane(stage):
                    devices.follow_share()
                    self.run_one(stage)
            finally:
                devices.share_cores(ident[0], None)
                devices.share_cores(self.main, None)  # the stage in hand may take every core now (fastText's jobs do)
                locks.set_lane(None)

        logger().info("%s runs beside %s and the stages after it that do not read it (%d of %d cores; "
                      "--sequential: one stage at a time)", stage, beside, share, self.cores, extra=SHOWN)  # fmt: skip
        self.side = (stage, self.pool.submit(context.run, lane), ident)

    def _share_main(self) -> bool:
        """The main lane's share for the stage it starts: the cores the side lane leaves, or
        all of them again (torch's threads as they were before)."""
        running = self.side is not None and not self.side[1].done()
        if running:
            if self.torch_threads is None and "torch" in sys.modules:
                self.torch_threads = _torch().get_num_threads()
            devices.share_cores(self.main, self.cores - max(1, self.cores // 2))
            devices.follow_share()
            return True
        else:
            devices.share_cores(self.main, None)
            if self.torch_threads is not None:
                _torch().set_num_threads(self.torch_threads)
                self.torch_threads = None
            return False

    def _stop_side(self, error: BaseException) -> None:
        """The main lane raised: a stop stops the side lane too; an error lets it finish its stage."""
        if self.side is None:
            return
        stage, future, ident = self.side
        stop = _stop_in(error)
        if stop is not None:
            if ident and not future.done():
                _raise_in(ident[0], stop)
            try:
                stopped = future.exception(timeout=JOIN_S)
            except Exception:  # noqa: BLE001 - still in C code: the process's watchdog ends it (process.interrupts)
                return
            if stopped is not None:
                # a database connection stopped inside a transaction holds SQLite's lock while
                # those frames live (the main lane then waits on it, ending its MLflow run)
                let_go(stopped)
            return
        failed = self.in_hand or "the run's own code, between two stages"
        logger().warning("%s failed; %s, beside it, finishes first (Ctrl-C stops it)", failed, stage)
        beside = future.exception()
        if beside is not None:
            logger().error("%s, beside it, failed too: %s", stage, beside)


def _stop_in(error: BaseException) -> type | None:
    """What stops the side lane when the main lane raised `error` (a class: an async exception
    is raised as a class, without arguments), None when `error` is a failure, not a stop.
    A stop is Ctrl-C's KeyboardInterrupt (process.interrupts.Interrupted), or whatever the
    main lane raised while a signal stops the process: Prefect's TerminationSignal (its
    SIGTERM handler stands in front of ours while a flow runs; not a KeyboardInterrupt) or an
    error the signal caused (a query interrupted). Taken for a failure, the side lane was left
    to finish its stage, and the watchdog ended the process after its grace (2.3-3.8 s)."""
    from mule.process import interrupts

    signum = getattr(error, "signum", None)  # ours: Interrupted
    if isinstance(error, KeyboardInterrupt) and signum is None:
        return type(error)  # Python's own
    if getattr(error, "signal", None) in interrupts.SIGNALS:
        signum = error.signal  # Prefect's TerminationSignal
    elif not isinstance(error, KeyboardInterrupt):
        signum = interrupts.stopping() if interrupts.stopping_soon() else None  # an error the signal caused
    if signum is None:
        return None
    return type("Interrupted", (interrupts.Interrupted,),
                {"__init__": lambda self: interrupts.Interrupted.__init__(self, signum)})  # fmt: skip


def _raise_in(thread: int, exception: type) -> None:
    ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread), ctypes.py_object(exception))


def _torch():
    """torch, once imported: `import torch` waits while the other lane is still inside its
    import (sys.modules holds a module half made then: no get_num_threads yet)."""
    import torch

    return torch


def logger() -> logging.Logger:
    return logging.getLogger("mule.pipeline")
