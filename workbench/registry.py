"""Finds variants through pluggy: every plugin, built-in or third-party, comes in by entry point."""

from __future__ import annotations

import functools
import warnings

import pluggy

from workbench import hookspecs
from workbench.errors import unknown_name
from workbench.variants import AXES

ENTRY_POINT_GROUP = "workbench"
BUILTIN_PACKAGE = "workbench_plugins."  # plugins/, as installed

HOOK_OF_AXIS = {
    "position": "register_position_schemes",
    "attention": "register_attention_variants",
    "norm": "register_norm_placements",
    "ffn": "register_ffn_types",
    "task": "register_tasks",
}
NOUN_OF_AXIS = {
    "position": "position scheme",
    "attention": "attention variant",
    "norm": "norm placement",
    "ffn": "FFN type",
    "task": "task",
}


@functools.cache
def plugin_manager() -> pluggy.PluginManager:
    pm = pluggy.PluginManager(ENTRY_POINT_GROUP)
    pm.add_hookspecs(hookspecs)
    pm.load_setuptools_entrypoints(ENTRY_POINT_GROUP)
    pm.check_pending()  # a misspelled hook name in a plugin fails here, loudly
    return pm


@functools.cache
def variants(axis: str) -> dict[str, type]:
    """Every registered variant of one axis, by name."""
    if axis not in AXES:
        raise ValueError(f"unknown axis {axis!r}; axes are {AXES}")
    found: dict[str, type] = {}
    # Built-ins first, so that an installed package that reuses a name overrides the built-in.
    classes = [cls for batch in getattr(plugin_manager().hook, HOOK_OF_AXIS[axis])() for cls in batch]
    classes.sort(key=lambda cls: not cls.__module__.startswith(BUILTIN_PACKAGE))
    for cls in classes:
        if cls.axis != axis:
            raise TypeError(f"{cls.__qualname__} has axis {cls.axis!r} but was registered as {axis}")
        if cls.name in found and found[cls.name] is not cls:
            warnings.warn(
                f"{NOUN_OF_AXIS[axis]} {cls.name!r} from {cls.__module__} overrides "
                f"{found[cls.name].__module__}",
                stacklevel=2,
            )
        found[cls.name] = cls
    return dict(sorted(found.items()))


def get_variant(axis: str, name: str, field: str | None = None) -> type:
    """The class registered under `name`; a SpecError naming the field and the choices otherwise."""
    registered = variants(axis)
    if name not in registered:
        raise unknown_name(field or axis, name, registered, NOUN_OF_AXIS[axis])
    return registered[name]


def distribution_of(cls: type) -> str:
    """The installed package a variant comes from, as pip names it."""
    module = cls.__module__
    for plugin, dist in plugin_manager().list_plugin_distinfo():
        if getattr(plugin, "__name__", None) == module:
            return f"{dist.metadata['name']} {dist.version}"
    return module
