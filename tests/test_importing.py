"""workbench.importing.loading: a heavy import runs without collections, and in the workbench's
own process leaves what it loaded out of later ones; garbage from before is collected, not frozen;
a library caller's objects are never frozen; a loaded module's block changes nothing."""

import gc
import sys
import weakref

import pytest

from workbench import importing
from workbench.importing import loading


class Node:
    """An object that can sit in a reference cycle (only the cyclic collector frees it)."""


@pytest.fixture
def module_file(tmp_path, monkeypatch):
    """A module never imported yet, whose import makes a few thousand objects."""
    (tmp_path / "heavy_for_loading.py").write_text("TABLE = [{'row': i} for i in range(5000)]\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    thresholds = gc.get_threshold()
    gc.set_threshold(0)  # no automatic collection during the test (the collector stays enabled): only `loading`'s
    try:
        yield "heavy_for_loading"
    finally:
        gc.set_threshold(*thresholds)
        sys.modules.pop("heavy_for_loading", None)
        gc.unfreeze()  # the frozen objects go back to the oldest generation, as before the test


def cycle() -> weakref.ref:
    a, b = Node(), Node()
    a.other, b.other = b, a
    return weakref.ref(a)


@pytest.fixture
def own_process(monkeypatch):
    monkeypatch.setattr(importing, "FREEZE", False)
    importing.own_process()
    assert importing.FREEZE


def test_first_import_runs_without_collections_and_is_frozen_after(module_file, own_process):
    collections = []
    gc.callbacks.append(lambda phase, info: collections.append(info["generation"]) if phase == "start" else None)
    try:
        leftover = cycle()  # garbage before the block: collected, never frozen
        frozen_before = gc.get_freeze_count()
        with loading(module_file):
            collected_at_start = len(collections)
            assert not gc.isenabled()
            import heavy_for_loading  # noqa: F401
            assert len(collections) == collected_at_start  # no collection while it loads
        assert gc.isenabled()
        assert leftover() is None
        assert gc.get_freeze_count() >= frozen_before + 5000  # the module's table left out of later collections
    finally:
        gc.callbacks.pop()


def test_a_library_callers_objects_are_never_frozen(module_file, monkeypatch):
    monkeypatch.setattr(importing, "FREEZE", False)  # a program that imports the workbench, not its command
    frozen = gc.get_freeze_count()
    with loading(module_file):
        assert not gc.isenabled()  # the pause still applies
        import heavy_for_loading  # noqa: F401
        a, b = Node(), Node()  # the caller's cycle, alive at the block's end
        a.other, b.other = b, a
    assert gc.isenabled()
    assert gc.get_freeze_count() == frozen
    alive = weakref.ref(a)
    del a, b
    gc.collect()
    assert alive() is None  # garbage later: the collector frees it


def test_a_loaded_module_changes_nothing(module_file, own_process):
    with loading(module_file):
        import heavy_for_loading  # noqa: F401
    frozen = gc.get_freeze_count()
    leftover = cycle()
    with loading(module_file):
        assert gc.isenabled()
    assert gc.get_freeze_count() == frozen
    assert leftover() is not None  # no collection was forced
    gc.collect()
    assert leftover() is None  # and the ordinary collector still frees it


def test_a_process_without_the_collector_keeps_it_off(module_file, own_process):
    gc.disable()
    try:
        frozen = gc.get_freeze_count()
        with loading(module_file):
            import heavy_for_loading  # noqa: F401
        assert not gc.isenabled()
        assert gc.get_freeze_count() == frozen
    finally:
        gc.enable()
