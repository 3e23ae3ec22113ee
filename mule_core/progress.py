"""Progress lines for long work: done/total, rate and ETA, at most every 20 seconds.

Goes through `logging` (logger "mule.*"), which Prefect adds to its run logs.
"""

from __future__ import annotations

import logging
import time

# `extra=SHOWN` on a log record: a line for people, shown on the console (commands/console.py);
# the others go to the run's log file only
SHOWN = {"console": True}

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
        interval: float = 20.0,
        clock=time.perf_counter,
        done: int = 0,
        base: int | None = None,
        started: float | None = None,
    ):
        """done: items finished before this counter started (a resumed run, an earlier shard):
        they count toward done/total, not toward the rate, unless `base` says how many of
        them not to count and `started` (time.time()) when the counted ones began: a
        counter that carries on another's (the features stage's shards, one after another)."""
        self.label, self.total, self.unit = label, total, unit
        self.logger = logger or logging.getLogger("mule.progress")
        self.interval, self.clock = interval, clock
        self.done = done
        self.base = done if base is None else base
        self.started = self.last = clock()
        if started is not None:
            self.started -= max(0.0, time.time() - started)

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
            self.logger.info(self.line(), extra=SHOWN)

    def finish(self) -> str:
        """The last line; on the console only after long work (a line a second later says nothing)."""
        text = self.line()
        long = self.clock() - self.started >= self.interval / 2
        self.logger.info(text, extra=SHOWN if long else None)
        return text
