"""Pieces the training stages (LP, joint training, adding a language) share."""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path
from time import monotonic

from mule.mule_core.progress import SHOWN
from mule.tasks.shared.context import StageContext, logger


def divergence_tags(trainer, result, stage: str) -> dict[str, str]:
    """The guard's verdict on an epoch, as tags for the stage's run (none when it did not
    fire): the first epoch that diverged, and the latest divergence with what was done."""
    if result.divergence is None:
        return {}
    first = next(r.epoch for r in [*trainer.history, result] if r.divergence)
    return {"mule.diverged": "true", "mule.diverged_epoch": str(first),
            f"mule.{stage}.divergence": f"epoch {result.epoch}: {result.divergence}",
            f"mule.{stage}.divergence_action": result.action or ""}  # fmt: skip


class Checkpoints:
    """A training stage's checkpoint: the trainer's whole state after every epoch, written
    atomically, resumed only by a run of the very same stage key (the same inputs, config
    and code), read without pickle (torch's weights_only loader: a checkpoint is tensors,
    numbers and strings), and removed once the stage's result is recorded.

    The state is copied at the epoch's end and written on a thread of its own while the
    next epoch trains: on the real text a checkpoint is 1.4 GB (the weights, Adam's two
    moments and the weight average of 85 M parameters). One write at a time: the next save
    waits for the last (and raises its error). A stop or crash mid-write leaves the previous
    checkpoint whole (the write is atomic), as a stop during a write in the stage's own
    thread did.

    A large checkpoint (YIELD_BYTES and over) is written at the lowest CPU priority (nice
    19, on Linux), with the cycles training leaves idle. At the same priority a 5 s write
    cost the real-text LP epoch after it 4-5 s (its first steps ran at half speed); at nice
    19 the write takes 16 s and training is not measurably slower (bench/checkpoint_cost.py).
    A small one (every test, the demo: milliseconds) keeps the stage's priority: at nice 19
    beside other busy processes it could wait seconds for a core, and a stop waits for it.
    An epoch that ends while a write is still going on writes none. Where a long writer
    could not yield, writes are spaced so that they take at most a fifth of the training's
    time: after every epoch while a write takes under a second, else once SPACING times the
    last write's duration has passed since it began. The last epoch writes none: the stage
    saves its model next and would remove it at once."""

    SPACING = 5  # a write's duration x this: the least time between two long writes' starts
    LONG_WRITE_S = 1.0
    YIELD_BYTES = 256 * 2**20

    def __init__(self, ctx: StageContext, path: Path):
        self.ctx, self.path = ctx, path
        self._writer: threading.Thread | None = None
        self._failed: BaseException | None = None
        self._last_start: float | None = None  # when the last write began (time.monotonic())
        self._last_seconds = 0.0  # how long it took
        self._yielded = False  # whether the last writer ran at the lowest priority

    def resume(self, trainer) -> None:
        state = read_checkpoint(self.path) if self.path.exists() else None
        if state is None:
            return
        if self.ctx.key and state.get("key") == self.ctx.key:
            trainer.load_state_dict(state["trainer"])
            logger().info("resuming from the checkpoint after epoch %d (%s)", trainer.epoch, self.path, extra=SHOWN)
        else:
            logger().info("ignoring a checkpoint of another setting, inputs or code (%s)", self.path, extra=SHOWN)

    def save(self, trainer) -> None:
        """After an epoch: a checkpoint of the trainer, when one is due (the class says when)."""
        if not self.due(trainer):
            return
        from mule.data_catalog.model_files import save_atomic

        self.wait()
        state = {"key": self.ctx.key, "trainer": snapshot(trainer.state_dict())}
        large = tensor_bytes(state) >= self.YIELD_BYTES
        self._last_start = monotonic()

        def write() -> None:
            try:
                self._yielded = large and yield_cpu()
                save_atomic(state, self.path)
                self._last_seconds = monotonic() - self._last_start
            except BaseException as error:  # noqa: BLE001 - raised in the stage's thread by the next wait()
                self._failed = error

        self._writer = threading.Thread(target=write, name=f"checkpoint {self.path.name}", daemon=True)
        self._writer.start()

    def due(self, trainer) -> bool:
        if trainer.finished:
            return False  # the stage saves its model next
        if self._failed is not None or self._last_start is None:
            return True  # the first, or the next save raises the last one's error
        if self._writer is not None and self._writer.is_alive():
            return False
        if self._yielded or self._last_seconds < self.LONG_WRITE_S:
            return True
        return monotonic() - self._last_start >= self.SPACING * self._last_seconds

    def wait(self) -> None:
        """Until the checkpoint being written is on the disk; its error, if it failed."""
        if self._writer is not None:
            self._writer.join()
            self._writer = None
        if self._failed is not None:
            failed, self._failed = self._failed, None
            raise failed

    @contextmanager
    def training(self) -> Iterator[None]:
        """Around the training: when it stops or fails, the checkpoint being written is
        finished first (a stop keeps the last epoch; the stop's watchdog bounds the wait)."""
        try:
            yield
        except BaseException:
            if self._writer is not None:
                self._writer.join()
            raise
        self.wait()

    def remove_once_recorded(self) -> None:
        self.wait()
        self.ctx.after_record.append(lambda: self.path.unlink(missing_ok=True))


def fit_checkpointed(ctx: StageContext, trainer, path: Path, stage: str, metrics: Callable[[object], dict],
                     keep: Callable[[list], None]) -> tuple[list, float]:  # fmt: skip
    """The training stages' fit: resumed from the checkpoint at `path` when one is there, a
    checkpoint after every epoch (beside the epoch's `metrics` and the divergence guard's
    tags, reported), then `keep(history)` writes the kept model and the checkpoint goes once
    the run is recorded. Returns the history and the seconds from the first epoch on."""
    checkpoints = Checkpoints(ctx, path)
    checkpoints.resume(trainer)

    def on_epoch(result) -> None:
        ctx.report.metrics(metrics(result), step=result.epoch)
        ctx.report.tags(divergence_tags(trainer, result, stage))
        checkpoints.save(trainer)

    started = time.perf_counter()
    with checkpoints.training():
        history = trainer.fit(on_epoch)
    keep(history)
    checkpoints.remove_once_recorded()
    return history, round(time.perf_counter() - started, 1)


def yield_cpu() -> bool:
    """Puts the calling thread at the lowest CPU priority (nice 19): it runs when the cores
    are idle. Linux alone names a thread this way (elsewhere the id could be another
    process's): False there, or when the system refuses."""
    if sys.platform != "linux":
        return False
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)
    except OSError:
        return False
    return True


def tensor_bytes(state) -> int:
    """The bytes of the tensors in a (nested) state dict."""
    if isinstance(state, dict):
        return sum(tensor_bytes(v) for v in state.values())
    if isinstance(state, (list, tuple)):
        return sum(tensor_bytes(v) for v in state)
    return state.numel() * state.element_size() if hasattr(state, "element_size") else 0


def snapshot(state: dict) -> dict:
    """The trainer's state as it is now, on the CPU: training moves its tensors in place.
    The best epoch's copies are copies already (mule_core.training.average.cpu_copy): kept
    as they are."""
    from mule.mule_core.training.average import cpu_copy

    def part(key, value):
        if key == "best" and isinstance(value, dict):
            return {k: v if k in ("state", "optimizer") else cpu_copy(v) for k, v in value.items()}
        return cpu_copy(value)

    return {k: part(k, v) for k, v in state.items()}


def read_checkpoint(path: Path) -> dict | None:
    """The checkpoint, or None when it cannot be read (cut, overwritten, or holding objects
    a checkpoint never holds): training starts over."""
    import torch

    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
        if isinstance(state, dict) and "trainer" in state:
            return state
    except Exception as error:  # noqa: BLE001 - torch raises many kinds for a damaged file
        logger().warning("the checkpoint %s is unreadable (%s): training starts from epoch 1", path,
                         str(error).splitlines()[0][:120] if str(error) else type(error).__name__)  # fmt: skip
        return None
    logger().warning("the checkpoint %s is not one: training starts from epoch 1", path)
    return None


def history_records(history) -> list[dict]:
    """A trainer's epochs as plain records: part of a stage's summary, drawn by its publisher."""
    return [asdict(epoch) for epoch in history]


def phase_seconds(history) -> dict[str, float]:
    """Where a training's time went, summed over its epochs (batches, forward, backward,
    optimizer, validation): part of a stage's summary, so bench/stage_times.py can print it."""
    totals: dict[str, float] = {}
    for epoch in history:
        for phase, seconds in (epoch.phases or {}).items():
            totals[phase] = round(totals.get(phase, 0.0) + seconds, 2)
    return totals
