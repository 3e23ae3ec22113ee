"""Progress lines for long work: done/total, rate and ETA, at most every few seconds.

Goes through `logging` (logger "mule.*"), which Prefect adds to its run logs.
"""

from __future__ import annotations

import logging
import time


def format_seconds(seconds: float) -> str:
    seconds = max(0, int(round(seconds)))
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


class Progress:
    def __init__(
        self,
        label: str,
        total: int,
        unit: str = "items",
        logger: logging.Logger | None = None,
        interval: float = 10.0,
        clock=time.perf_counter,
        done: int = 0,
    ):
        """done: items finished before this counter started (a resumed run, an earlier shard):
        they count toward done/total, not toward the rate."""
        self.label, self.total, self.unit = label, total, unit
        self.logger = logger or logging.getLogger("mule.progress")
        self.interval, self.clock = interval, clock
        self.done = self.base = done
        self.started = self.last = clock()

    def line(self) -> str:
        elapsed = max(self.clock() - self.started, 1e-9)
        rate = (self.done - self.base) / elapsed
        eta = (self.total - self.done) / rate if rate > 0 else float("inf")
        eta_text = format_seconds(eta) if eta != float("inf") else "?"
        return (
            f"{self.label}: {self.done}/{self.total} {self.unit} "
            f"({rate:.1f} {self.unit}/s, elapsed {format_seconds(elapsed)}, ETA {eta_text})"
        )

    def update(self, n: int = 1) -> None:
        self.done += n
        now = self.clock()
        if now - self.last >= self.interval and self.done < self.total:
            self.last = now
            self.logger.info(self.line())

    def finish(self) -> str:
        text = self.line()
        self.logger.info(text)
        return text
