"""Stopping a sweep on SIGTERM or SIGINT without losing or half-writing anything.

    signal -> request_stop() -> every registered event is set
           -> the training loop finishes its step, checkpoints it, raises RunInterrupted
           -> the executor starts nothing new, waits for its running runs, re-raises
           -> the CLI prints one line and exits 130

The driver's handler also sets the event shared with its worker processes (--jobs N), so
the workers stop the same way; a worker whose driver disappears (SIGKILL) notices through a
watchdog on its parent's pid and stops too, then exits instead of waiting for work.
A second signal acts as if no handler were installed (the default: end now).
"""

from __future__ import annotations

import os
import signal
import threading
import time
from typing import Any

from workbench.errors import WorkbenchError

SIGNALS = (signal.SIGTERM, signal.SIGINT)
PARENT_POLL_S = 0.5
ORPHAN_GRACE_S = 120  # a worker without its driver exits at the latest this long after noticing


class RunInterrupted(WorkbenchError):
    """The sweep was stopped by a signal; finished runs are recorded, the running one checkpointed."""

    exit_code = 130


_events: list[Any] = [threading.Event()]  # this process's event, plus one shared with workers
_received: list[str] = []


def register_event(event: Any) -> None:
    """Also set `event` (e.g. a multiprocessing.Event shared with workers) when a stop is requested."""
    _events.append(event)


def unregister_event(event: Any) -> None:
    if event in _events:
        _events.remove(event)


def request_stop(reason: str = "a stop request") -> None:
    _received.append(reason)
    for event in _events:
        event.set()


def stop_requested() -> bool:
    return any(event.is_set() for event in _events)


def reason() -> str:
    return _received[0] if _received else "a stop request"


def reset() -> None:
    """Forget an earlier stop request (a new sweep in the same process)."""
    _received.clear()
    for event in _events:
        event.clear()


def _handler(signum: int, frame: Any) -> None:
    name = signal.Signals(signum).name
    if stop_requested():  # the second signal: stop now
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)
        return
    request_stop(name)


def install_handlers() -> dict[int, Any]:
    """Route SIGTERM and SIGINT to request_stop(); returns the previous handlers (for restore).
    Only the main thread can install handlers: elsewhere (a thread, a test runner) nothing changes."""
    if threading.current_thread() is not threading.main_thread():
        return {}
    previous = {sig: signal.getsignal(sig) for sig in SIGNALS}
    for sig in SIGNALS:
        signal.signal(sig, _handler)
    return previous


def restore_handlers(previous: dict[int, Any]) -> None:
    for sig, handler in previous.items():
        signal.signal(sig, handler)


def watch_parent(parent_pid: int) -> None:
    """In a worker process: when the driver is gone (its pid is no longer our parent), stop the
    run in progress (it checkpoints) and exit; never linger as an orphan."""

    def watch() -> None:
        while os.getppid() == parent_pid:
            time.sleep(PARENT_POLL_S)
        request_stop("the driver process ended")
        time.sleep(ORPHAN_GRACE_S)
        os._exit(1)

    threading.Thread(target=watch, name="workbench-parent-watchdog", daemon=True).start()


def orphaned(parent_pid: int) -> bool:
    return os.getppid() != parent_pid
