"""Progress lines: done/total, the rate of this run's items only, and an ETA from it."""

import logging

from mule.mule_core.progress import Progress


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def test_rate_and_eta_count_only_the_items_this_counter_saw():
    clock = Clock()
    # A shard that starts at image 8,000 of 10,000: those 8,000 were done by earlier shards.
    progress = Progress("features", 10_000, "images", clock=clock, done=8_000)
    clock.now = 10.0
    progress.update(500)
    assert progress.line() == "features: 8500/10000 images (50.0 images/s, elapsed 10s, ETA 30s)"


def test_a_line_every_interval_and_none_after_the_last_item(caplog):
    clock = Clock()
    progress = Progress("tokenising", 30, "captions", logger=logging.getLogger("t"), interval=10, clock=clock)
    with caplog.at_level(logging.INFO, logger="t"):
        for _ in range(3):
            clock.now += 10
            progress.update(10)
    assert [r.getMessage() for r in caplog.records] == [
        "tokenising: 10/30 captions (1.0 captions/s, elapsed 10s, ETA 20s)",
        "tokenising: 20/30 captions (1.0 captions/s, elapsed 20s, ETA 10s)",
    ]


def test_a_counter_that_carries_on_another_counts_from_when_the_first_began():
    """The features stage's shards, one after another: the second shard's line gives the
    time since the first shard began and the rate over both (it restarted at each shard)."""
    import time

    clock = Clock()
    began = time.time() - 20.0  # the first shard began 20 s ago and did 2,000 images
    progress = Progress("features", 4_000, "images", clock=clock, done=2_000, base=0, started=began)
    clock.now = 10.0
    progress.update(1_000)
    line = progress.line()
    assert line.startswith("features: 3000/4000 images (100.0 images/s, elapsed 30s, ETA 10s)"), line


def test_the_last_line_reaches_the_console_only_after_long_work(caplog):
    clock = Clock()
    quick = Progress("translating", 10, logger=logging.getLogger("t"), interval=10, clock=clock)
    with caplog.at_level(logging.INFO, logger="t"):
        clock.now = 1.0
        quick.finish()
        slow = Progress("features", 10, logger=logging.getLogger("t"), interval=10, clock=clock)
        clock.now = 9.0
        slow.finish()
    assert [getattr(r, "console", False) for r in caplog.records] == [False, True]
