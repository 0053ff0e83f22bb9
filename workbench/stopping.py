"""Stopping a sweep on SIGTERM or SIGINT without losing or half-writing anything.

One process decides: the driver (the `workbench run` process). Its handler turns the first
signal into a stop request; its worker processes hold SIGINT and SIGTERM blocked from their
first instruction, then ignore them (signals_blocked: a terminal's Ctrl-C, which signals the
whole process group, cannot kill one while it starts) and stop when the driver tells them to
(workbench.run.executor). While a run trains, a signal to a worker requests the same stop
(handle_during_training replaces the SIGTERM handler Lightning installs).

    signal -> driver: request_stop() -> the executor tells each worker to stop
           -> each training loop finishes its step, checkpoints it, raises RunInterrupted
           -> the executor starts nothing new, collects its running runs, re-raises
           -> the CLI prints one line and exits 130

`workbench run` installs the handler before anything else, so a signal during start-up,
training, or a store or report write is the same clean stop; during start-up and a report
build, which have nothing to checkpoint, it ends the process at once (`immediate`). A worker
whose driver disappears (SIGKILL) notices (its pipe closes), stops its run and exits. A
second signal to the driver acts as if no handler were installed (end now).
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from workbench.errors import WorkbenchError

SIGNALS = (signal.SIGTERM, signal.SIGINT)
ORPHAN_GRACE_S = 30  # a worker without its driver exits at the latest this long after noticing


class RunInterrupted(WorkbenchError):
    """The sweep was stopped by a signal; finished runs are recorded, the running one checkpointed."""

    exit_code = 130


_requested = threading.Event()
_received: list[str] = []  # the signals (or other reasons) this process was asked to stop for
_signalled: list[str] = []  # the signals its handler received
_at_once: list[str | None] = [None]  # set: a signal ends the process at once, saying this (immediate)


def request_stop(reason: str = "a stop request") -> None:
    _received.append(reason)
    _requested.set()


def stop_requested() -> bool:
    return _requested.is_set()


def check(what: str = "no run was training") -> None:
    """Raise RunInterrupted(what) if a stop was requested (long work checks between its parts)."""
    if stop_requested():
        raise RunInterrupted(what)


BEFORE_START = "before the sweep began: nothing was trained or recorded; run the same command again to start it"


def reason() -> str:
    return _received[0] if _received else "a stop request"


def reset() -> None:
    """Forget an earlier stop request (a new sweep in the same process)."""
    _received.clear()
    _signalled.clear()
    _requested.clear()


def _handler(signum: int, frame: Any) -> None:
    name = signal.Signals(signum).name
    if _signalled:  # the second signal this process received: stop now
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)
        return
    _signalled.append(name)
    request_stop(name)
    if _at_once[0] is not None:  # os.write: the main thread may be inside a print to stderr
        os.write(2, f"error: stopped by {name} {_at_once[0]}\n".encode())
        os._exit(RunInterrupted.exit_code)


@contextmanager
def immediate(what: str | None) -> Iterator[None]:
    """Within `immediate(what)`, in a `workbench` process: a signal prints "error: stopped by
    SIGINT <what>" and ends the process at once (exit 130). For work that has written nothing
    yet, or only into a scratch folder the next run removes (start-up, a report being built);
    never an exception, which an import or a library could catch halfway. `immediate(None)`
    inside it shields a step that must not be cut in half (swapping the built report in)."""
    before = _at_once[0]
    _at_once[0] = what
    try:
        if what is not None:
            check(f"stopped by {reason()} {what}")
        yield
    finally:
        _at_once[0] = before if _at_once[0] == what else _at_once[0]  # a defer() inside stands


def defer() -> None:
    """End an `immediate` start-up for good: from here a signal only requests the stop (a sweep
    began, whose running runs checkpoint first)."""
    _at_once[0] = None


def install_handlers() -> dict[int, Any]:
    """In the driver: route SIGTERM and SIGINT to request_stop(); returns the handlers it
    replaced (for restore_handlers), none when ours were in place already. Only the main
    thread can install handlers: elsewhere (a thread, a test runner) nothing changes."""
    if threading.current_thread() is not threading.main_thread():
        return {}
    previous = {sig: signal.getsignal(sig) for sig in SIGNALS if signal.getsignal(sig) is not _handler}
    for sig in previous:
        signal.signal(sig, _handler)
    return previous


def restore_handlers(previous: dict[int, Any]) -> None:
    for sig, handler in previous.items():
        signal.signal(sig, handler)


def leave_to_default() -> None:
    """A command other than a sweep ends at once on a signal (KeyboardInterrupt on SIGINT);
    one that arrived while it started ends it now."""
    if threading.current_thread() is not threading.main_thread():
        return
    restore_handlers({signal.SIGINT: signal.default_int_handler, signal.SIGTERM: signal.SIG_DFL})
    if _received:
        raise KeyboardInterrupt


@contextmanager
def signals_blocked() -> Iterator[None]:
    """Hold SIGINT and SIGTERM back while starting a worker process: it inherits the blocked
    mask and ignores both (ignore_signals) before any can reach it; the driver receives a
    signal that arrived meanwhile as soon as this block ends (or at once, through a thread
    that does not block it: Python runs the handler in the main thread either way)."""
    before = signal.pthread_sigmask(signal.SIG_BLOCK, SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, before)


_in_worker = [False]  # this process is a sweep's worker (ignore_signals): its driver decides


def ignore_signals() -> None:
    """In a worker: SIGINT and SIGTERM are the driver's to handle (it relays a stop through
    the shared event) until a run trains (handle_during_training); a pending one is discarded."""
    _in_worker[0] = True
    for sig in SIGNALS:
        signal.signal(sig, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, SIGNALS)


def _request_handler(signum: int, frame: Any) -> None:
    request_stop(signal.Signals(signum).name)


def handle_during_training() -> None:
    """Called as a training loop starts, once Lightning has installed its own SIGTERM handler
    (its _SignalConnector), which would end the run at its next step without checkpointing it:
    SIGTERM and SIGINT request the workbench's stop instead, so the run checkpoints the step
    it stopped at. A worker's handler only requests the stop (its driver kills it if it does
    not end in time); any other process gets the driver's (a second signal ends it at once).
    Lightning puts back the handlers it found when training ends (a worker ignores again)."""
    if threading.current_thread() is not threading.main_thread():
        return
    for sig in SIGNALS:
        signal.signal(sig, _request_handler if _in_worker[0] else _handler)
