"""Ctrl-C and SIGTERM: a command stops within two seconds, says what it kept, exits 130 / 143.

The first signal raises `Interrupted` (a KeyboardInterrupt) in the main thread, so the
stage in hand unwinds as Python code does: Prefect marks its task and flow runs crashed,
MLflow runs end KILLED (experiments.tracking), the workdir's lock is released, and the
command prints one line. Code that does not come back to the interpreter (a fastText
epoch, one long batch in C) cannot see that exception, and while a flow runs Prefect's
own SIGTERM handler stands in front of ours: so the signal also arms a watchdog, through
the interpreter's wakeup fd, which the C-level handler writes whatever Python handler is
installed. GRACE_S after the signal the watchdog ends the process, after the same
cleanups, whatever the main thread is doing. A batch in flight is dropped then, never
half-written: every table, model and record is written to a temporary file and renamed
(storage.atomic), so a stopped run leaves exactly what it finished, and the same
command resumes. A second signal ends the process at once.

Prefect's crash reports and the reconnection warnings of its clients are not shown once
a signal arrived: the one line says what happened.
"""

from __future__ import annotations

import _thread
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable

GRACE_S = 1.5
# What the cleanups (ending MLflow runs in SQLite, stopping Prefect's server) may take in
# all: one that hangs (a store locked by another process) is left, and the line comes out.
CLEANUP_S = 2.0
SIGNALS = (signal.SIGINT, signal.SIGTERM)


class Interrupted(KeyboardInterrupt):
    """What the first Ctrl-C (SIGINT) or SIGTERM raises in the main thread."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def how(signum: int) -> str:
    return "Ctrl-C" if signum == signal.SIGINT else signal.Signals(signum).name


def exit_code(signum: int) -> int:
    return 128 + signum


class _State:
    def __init__(self) -> None:
        self.installed = False
        self.armed: int | None = None  # the first signal, once the watchdog knows of it
        self.raised = False  # Interrupted was raised in the main thread
        self.again = False  # the signal is delivered again: a finaliser swallowed its stop
        self.arming = threading.Lock()
        self.finishing = threading.Lock()
        self.finished = False
        self.said = False  # the one line is out
        self.saying = threading.Lock()
        self.cleanups: list[Callable[[], None]] = []  # in order, before the line is printed
        self.last: list[Callable[[], None]] = []  # after it (the Prefect server, stopped last)
        self.abandon: list[Callable[[], None]] = []  # when the cleanups cannot run (a second signal)
        self.keys: set[str] = set()  # what the rooms registered once (on_stop's and at_stopped_exit's keys)
        self.at_exit: list[Callable[[], None]] = []  # as a stopped command exits (at_stopped_exit)
        self.message: Callable[[int], str] = lambda signum: f"mule: stopped ({how(signum)})"


_state = _State()


def install(message: Callable[[int], str]) -> None:
    """Handlers for SIGINT and SIGTERM in this (the command's) process; `message(signum)`
    is the one line printed when a signal stops it. Also when the shell started the
    command with SIGINT ignored (a background job): `mule` is asked to stop, not the shell."""
    _state.message = message
    if _state.installed:
        return
    for signum in SIGNALS:
        signal.signal(signum, _handler)
    sys.unraisablehook = _unraisable(sys.unraisablehook)
    read, write = os.pipe()
    os.set_blocking(write, False)
    signal.set_wakeup_fd(write, warn_on_full_buffer=False)
    threading.Thread(target=_watch, args=(read,), name="mule-interrupts", daemon=True).start()
    _state.installed = True


def _unraisable(shown: Callable) -> Callable:
    """A signal that lands in a finaliser or a weakref callback raises its exception
    (ours, or Prefect's TerminationSignal) where Python cannot raise: it prints it as
    "Exception ignored" and goes on. Its traceback is not shown: the stop is raised again in
    the main thread once it is out of the finaliser (and the watchdog ends the process all the
    same if it cannot unwind); other unraisable errors are shown, as before."""

    def hook(unraisable) -> None:
        error = unraisable.exc_value
        if isinstance(error, BaseException) and not isinstance(error, Exception):
            if is_stop(error) and threading.current_thread() is threading.main_thread():
                _debug(f"{type(error).__name__} swallowed in {unraisable.object!r}: raised again"[:300])
                _raise_again_in_main(error)
            return  # KeyboardInterrupt, TerminationSignal, SystemExit: a stop on its way
        shown(unraisable)

    return hook


def is_stop(error: BaseException | None, caused: bool = False) -> bool:
    """Whether `error` is what a stop raises: ours (Interrupted), Python's KeyboardInterrupt,
    or Prefect's TerminationSignal (an exception with the signal's number in `signal`; its
    engine's ExternalSignal). With `caused`, also an error a stop caused: any error once a
    signal is stopping this process (DuckDB turns the KeyboardInterrupt it sees mid-query
    into RuntimeError('Query interrupted'); Prefect says `Task run is not set` when the
    signal lands before its task run exists), or one whose cause or context holds a stop."""
    if caused and _state.armed is not None:
        return True
    seen: set[int] = set()
    while error is not None and id(error) not in seen:
        if (isinstance(error, KeyboardInterrupt) or getattr(error, "signal", None) in SIGNALS
                or any(c.__name__ == "ExternalSignal" for c in type(error).__mro__)):  # fmt: skip
            return True
        if not caused:
            return False
        seen.add(id(error))
        error = error.__cause__ or error.__context__
    return False


def _raise_again_in_main(error: BaseException) -> None:
    """The stop again in the main thread, as the signal raised it, once the main thread is
    out of the finaliser that swallowed it (a weakref callback of a WeakValueDictionary took
    a stop in the text stage: the stage went on until the watchdog's deadline): the signal
    is delivered again (`_thread.interrupt_main`), so the handler in front raises it, ours or
    Prefect's, at the main thread's next Python line. Nothing is raised into a thread from
    outside. From a thread of its own: from here, in the hook, it would be swallowed again."""
    signum = getattr(error, "signum", None) or getattr(error, "signal", None) or signal.SIGINT

    def later() -> None:
        # not inside an import: one stopped half way leaves a module half made, which the
        # next import of it can turn into an abort (torch's C++ types registered twice);
        # an import that never ends is the watchdog's
        deadline = time.monotonic() + GRACE_S
        while time.monotonic() < deadline:
            time.sleep(0.02)
            frame = sys._current_frames().get(threading.main_thread().ident)
            if frame is None:
                return
            if not _importing(frame):
                _state.again = True  # ours raises again, not taken for the second signal
                _thread.interrupt_main(signum)
                return

    threading.Thread(target=later, name="mule-stop-again", daemon=True).start()


def _importing(frame) -> bool:
    while frame is not None:
        if frame.f_code.co_filename.startswith("<frozen importlib"):
            return True
        frame = frame.f_back
    return False


def on_stop(cleanup: Callable[[], None], last: bool = False, abandon: Callable[[], None] | None = None,
            key: str | None = None) -> None:  # fmt: skip
    """`cleanup` runs when a signal stops the command (before its line is printed, or after
    it with last=True); `abandon` instead of it when there is no time (a second signal).
    `key`: registered once a process under that name (a room registering what a stop does
    to what it opened, the first time it opens one: its MLflow runs, its flow runs)."""
    if key is not None:
        if key in _state.keys:
            return
        _state.keys.add(key)
    (_state.last if last else _state.cleanups).append(cleanup)
    if abandon is not None:
        _state.abandon.append(abandon)


def at_stopped_exit(action: Callable[[], None], key: str) -> None:
    """`action` runs as a stopped command exits, before the exit handlers (Prefect's log
    drain, which would spend the stop's seconds); once a process under `key`."""
    if key not in _state.keys:
        _state.keys.add(key)
        _state.at_exit.append(action)


def stopped_exit() -> None:
    """The actions at_stopped_exit registered, when a signal stopped this process (the
    command's entry calls it before the exit handlers run)."""
    if _state.armed is None:
        return
    for action in _state.at_exit:
        try:
            action()
        except Exception:  # noqa: BLE001 - the exit goes on; the stop's line was said
            pass


def stopping() -> int | None:
    """The signal that is stopping this process, if one is."""
    return _state.armed


def stopping_soon(wait: float = 0.1) -> bool:
    """Whether a signal is stopping this process, waiting up to `wait` seconds for the
    watchdog to learn of one: while a flow runs, Prefect's SIGTERM handler raises in the
    main thread before the watchdog's thread has had the GIL (and DuckDB turns that into
    RuntimeError('Query interrupted')). Without handlers installed: whether one is now."""
    deadline = time.monotonic() + wait
    while _state.armed is None and _state.installed and time.monotonic() < deadline:
        time.sleep(0.005)
    return _state.armed is not None


def _watch(read: int) -> None:
    while True:
        try:
            data = os.read(read, 64)
        except OSError:
            return
        for signum in data:
            if signum in SIGNALS:
                _arm(signum)


def _arm(signum: int) -> None:
    with _state.arming:
        if _state.armed is not None:
            return
        _state.armed = signum
    _debug("armed")
    logging.disable(logging.CRITICAL)  # Prefect's crash lines and its clients' retries: the line says it
    threading.Thread(target=_deadline, name="mule-deadline", daemon=True).start()


def _deadline() -> None:
    time.sleep(GRACE_S)
    _debug("deadline: the main thread did not unwind in time")
    if os.environ.get("MULE_INTERRUPT_DEBUG"):  # where it was: what kept it from unwinding
        import traceback

        names = {thread.ident: thread.name for thread in threading.enumerate()}
        main = threading.main_thread().ident
        # the main thread first and deepest; then the others (one holding a lock the main thread waits for)
        for ident, frame in sorted(sys._current_frames().items(), key=lambda item: item[0] != main):
            _debug(f" thread {names.get(ident, ident)}:")
            for line in traceback.format_stack(frame)[-(24 if ident == main else 10):]:
                _debug("  " + line.rstrip().replace("\n", " |"))
    _exit_now(_state.armed or signal.SIGINT, wait=0.3)


def _handler(signum: int, frame) -> None:
    if _state.again:  # the stop a finaliser swallowed, raised again (_raise_again_in_main)
        _state.again = False
        raise Interrupted(_state.armed or signum)
    if _state.raised:  # the second signal: no more waiting
        _exit_now(_state.armed or signum, wait=0)
    _state.raised = True
    _arm(signum)
    raise Interrupted(_state.armed or signum)


def finish(signum: int) -> int:
    """The cleanups and the one line (once, whoever calls first); returns the exit code."""
    if not _state.finishing.acquire(timeout=GRACE_S):
        return exit_code(signum)
    try:
        if not _state.finished:
            _state.finished = True
            deadline = time.monotonic() + CLEANUP_S
            _run(_state.cleanups, deadline)
            _say(signum)
            _run(_state.last, deadline + CLEANUP_S / 2)
    finally:
        _state.finishing.release()
    return exit_code(signum)


def _exit_now(signum: int, wait: float) -> None:
    if _state.finishing.acquire(timeout=wait) if wait else _state.finishing.acquire(blocking=False):
        _state.finishing.release()
        if not _state.finished:
            finish(signum)
    else:  # the main thread is in the cleanups: leave them, say the line all the same
        _run(_state.abandon)
        _say(signum)
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # noqa: BLE001 - a closed pipe must not keep the process alive
            pass
    os._exit(exit_code(signum))


def _run(actions: list[Callable[[], None]], deadline: float | None = None) -> None:
    """Each action in turn; with a deadline, each on a thread of its own, waited for only
    until the deadline: one that hangs is left behind (the process is about to end)."""
    for action in actions:
        if deadline is None:
            _quietly(action)
            continue
        left = deadline - time.monotonic()
        if left <= 0:
            _debug(f"no time left for {getattr(action, '__name__', action)}")
            continue
        worker = threading.Thread(target=_quietly, args=(action,), name="mule-cleanup", daemon=True)
        worker.start()
        worker.join(left)
        if worker.is_alive():
            _debug(f"{getattr(action, '__name__', action)} did not finish in time: left behind")


def _quietly(action: Callable[[], None]) -> None:
    try:
        action()
    except Exception:  # noqa: BLE001 - a cleanup that fails must not keep the others from running
        pass


def _say(signum: int) -> None:
    with _state.saying:
        if _state.said:
            return
        _state.said = True
    print(_safe_message(signum), file=sys.stderr, flush=True)


def _safe_message(signum: int) -> str:
    try:
        return _state.message(signum)
    except Exception:  # noqa: BLE001 - the line must come out whatever the workdir looks like
        return f"mule: stopped ({how(signum)}); run the same command to resume"


def _debug(what: str) -> None:
    if os.environ.get("MULE_INTERRUPT_DEBUG"):  # bench/interrupts.py: which path ended the process
        print(f"[interrupts {time.monotonic():.3f}] {what}", file=sys.stderr, flush=True)
