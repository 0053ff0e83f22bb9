"""Someone else's code given a time to return in: a plugin's import, a received tokenizer's
regular expressions on a prompt.

`call_within(seconds, call)` runs `call` in a daemon thread and waits at most `seconds` for it.
Python cannot stop a thread, so a call that does not return in time is left running in the
background, and the caller goes on without its result (TimedOut). The trade-offs of that choice:

- the command goes on and ends normally: a daemon thread never holds the interpreter's exit up,
  so a command that gave up on a call exits as it would have (the thread ends with the process);
- until then the call keeps what it holds: a core (a backtracking regex spins on), memory, and,
  for an import, the import lock of the module it is importing (an import of that same module
  elsewhere would wait for it; the workbench imports a plugin's module nowhere else);
- what the call does later is not undone: a plugin module finishing its import still sits in
  `sys.modules` (the workbench never registers it), and a print or warning it makes still shows;
- the wait ends in time only while the call lets the main thread run: Python code and blocking
  calls (sleep, I/O, a lock) always do, native code only where it releases the GIL (the
  `tokenizers` library's batch methods do; its one-text `encode` does not, so it is not used here).

A process would end the call for good, but would cost a process start per call, and a plugin
imported in another process is not registered in this one.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")


class TimedOut(Exception):
    """The call did not return within its time (it goes on in the background)."""


def call_within(seconds: float, call: Callable[[], T], name: str = "workbench-deadline") -> T:
    """`call()`'s result, or what it raised (a BaseException too, as it was raised), once it
    returns within `seconds`; TimedOut when it does not."""
    outcome: dict[str, Any] = {}

    def run() -> None:
        try:
            outcome["result"] = call()
        except BaseException as err:  # noqa: BLE001 - handed to the caller as it was raised
            outcome["error"] = err

    thread = threading.Thread(target=run, name=name, daemon=True)
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        raise TimedOut(f"did not return within {seconds:g} s")
    if "error" in outcome:
        raise outcome["error"]
    return outcome["result"]
