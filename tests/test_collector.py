"""The cyclic garbage collector is paused while bulk data is built (mule_core/collector.py):
held by several at once, it resumes when the last lets go, and a collector someone else
switched off stays off."""

import gc
import threading

import pytest

from mule.mule_core import collector


@pytest.fixture(autouse=True)
def collector_on():
    was = gc.isenabled()
    gc.enable()
    yield
    (gc.enable if was else gc.disable)()


def test_the_collector_is_off_inside_and_back_on_after_even_on_an_error():
    with collector.paused():
        assert not gc.isenabled()
        with collector.paused():  # nested: a loader calling another
            assert not gc.isenabled()
        assert not gc.isenabled()
    assert gc.isenabled()
    with pytest.raises(KeyError), collector.paused():
        raise KeyError("a bad row")
    assert gc.isenabled()


def test_threads_share_the_pause_and_the_last_to_leave_ends_it():
    first_in, first_out, second_in = threading.Event(), threading.Event(), threading.Event()

    def first():
        with collector.paused():
            first_in.set()
            second_in.wait(5)
        first_out.set()

    thread = threading.Thread(target=first)
    thread.start()
    first_in.wait(5)
    with collector.paused():
        second_in.set()
        first_out.wait(5)
        assert not gc.isenabled()  # the first let go; this one still holds it
    thread.join()
    assert gc.isenabled()


def test_a_collector_switched_off_elsewhere_stays_off():
    gc.disable()
    with collector.paused():
        pass
    assert not gc.isenabled()


def test_the_bulk_loaders_build_with_the_collector_paused():
    from mule.data_catalog.splits import load_split, load_vocabulary
    from mule.tasks.text import language_vocabulary

    seen = []
    record = collector.bulk(lambda: seen.append(gc.isenabled()) or "result")
    assert record() == "result" and seen == [False] and gc.isenabled()
    for loader in (load_split, load_vocabulary, language_vocabulary):
        assert loader.__code__ is record.__code__, loader  # wrapped by collector.bulk


def test_an_ngram_table_is_built_with_the_collector_paused(monkeypatch):
    from mule.mule_core import subwords

    seen = []
    original = subwords.char_ngrams
    monkeypatch.setattr(subwords, "char_ngrams", lambda *a: seen.append(gc.isenabled()) or original(*a))
    subwords.ngram_table(["<pad>", "<unk>", "collector", "collected"], (3,))
    assert seen and not any(seen) and gc.isenabled()


def test_a_pause_begins_with_a_collection_at_most_once_every_thirty_seconds(monkeypatch):
    """A finished stage's cyclic garbage goes before the next stage loads; the loaders of one
    stage, pausing again and again, pay for one full collection, not one each."""
    now = [1000.0]
    monkeypatch.setattr(collector, "monotonic", lambda: now[0])
    monkeypatch.setattr(collector, "_collected", [-collector.COLLECT_EVERY_S])
    collections = []
    monkeypatch.setattr(collector.gc, "collect", lambda *a: collections.append(now[0]))
    for step in (0.0, 1.0, 10.0, 29.0, 31.0, 95.0):
        now[0] = 1000.0 + step
        with collector.paused():
            pass
    assert collections == [1000.0, 1031.0, 1095.0]
