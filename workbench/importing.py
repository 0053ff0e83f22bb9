"""Loading the heavy libraries (torch, Lightning, scipy, pandas, matplotlib) without the cyclic
garbage collector scanning them over and over.

CPython runs a full collection each time a quarter more objects have survived since the last
one, so loading about 500,000 long-lived objects (functions, classes, modules) ran about ten full
collections over an ever larger heap: 1.3 s of the quickstart report's 6.7 s of CPU, 1.8 s of a
12-run study of 100 steps a run (28 s), measured with `gc.callbacks`. Nothing loaded is garbage,
so the collector pauses while a block loads; in the workbench's own processes (the command, its
workers) whatever is alive at the block's end is then frozen (`gc.freeze`) out of every later
collection, which is most of the saving: 4.9 against 6.2 s of CPU for the quickstart's report
with the pause alone. Garbage left before the block (a finished run's trainer and model, which
hold each other in cycles) is collected first, never frozen. A program that calls the workbench
as a library gets the pause, not the freeze: its objects alive at that moment would be frozen
too, and any of them that later became garbage in a cycle would never be freed.
"""

from __future__ import annotations

import gc
import sys
from collections.abc import Iterator
from contextlib import contextmanager

FREEZE = False  # set by `own_process()`: only the workbench's own processes freeze what they load


def own_process() -> None:
    """This process is the workbench's (the `workbench` command, one of its workers): what its
    heavy imports load lives as long as it does, so `loading` may freeze it."""
    global FREEZE
    FREEZE = True


@contextmanager
def loading(module: str) -> Iterator[None]:
    """The block imports `module` (and what it loads): the first time, without a collection
    while it runs, and in the workbench's own process what is alive at its end left out of
    later collections; once `module` is loaded, or where the collector is off (a nested block,
    a process that turned it off), the block runs as it is."""
    if module in sys.modules or not gc.isenabled():
        yield
        return
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        if FREEZE:
            gc.freeze()
        gc.enable()
