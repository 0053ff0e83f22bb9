"""Finds variants through pluggy: every plugin, built-in or third-party, comes in by entry point."""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import inspect
import math
import os
import sys
import warnings
from collections.abc import Callable
from typing import Any

import pluggy

from workbench import hookspecs
from workbench.deadline import TimedOut, call_within
from workbench.errors import WorkbenchWarning, closest, unknown_name
from workbench.variants import AXES, AXIS, MODEL_AXES, Variant, variant_names

ENTRY_POINT_GROUP = "workbench"
BUILTIN_PACKAGE = "workbench_plugins."  # plugins/, as installed

HOOK_OF_AXIS = {name: axis.hook for name, axis in AXIS.items()}
NOUN_OF_AXIS = {name: axis.noun for name, axis in AXIS.items()}


class PluginLoadWarning(WorkbenchWarning):
    """An installed plugin could not be loaded; it is left out and everything else works."""


# Plugin module name -> "distribution version" of the package that declared it.
PROVIDERS: dict[str, str] = {}
# Entry point name -> "distribution version": the plugin registered under that name.
PACKAGE_OF_PLUGIN: dict[str, str] = {}
BUILTIN_DISTRIBUTION = "transformer-workbench"


def package(dist) -> str:
    metadata = dist.metadata  # parsed from the METADATA file at every access: read once
    return f"{metadata['name']} {metadata['version']}"


def workbench_entry_points():
    """("name version" of its distribution, entry point) for every entry point in the `workbench` group."""
    for dist in importlib.metadata.distributions():
        ours = [ep for ep in dist.entry_points if ep.group == ENTRY_POINT_GROUP]
        if ours:
            label = package(dist)  # once per distribution, not per plugin (it was 0.1 s of every command)
            yield from ((label, ep) for ep in ours)


# How long a plugin's import may take: torch's first import on a loaded machine takes a few
# seconds; a plugin still importing after this is left out (workbench.deadline says what that costs).
PLUGIN_IMPORT_SECONDS = 60.0


def plugin_import_seconds() -> float:
    """PLUGIN_IMPORT_SECONDS, or WORKBENCH_PLUGIN_IMPORT_SECONDS when set to a positive number."""
    try:
        seconds = float(os.environ.get("WORKBENCH_PLUGIN_IMPORT_SECONDS", PLUGIN_IMPORT_SECONDS))
    except ValueError:
        return PLUGIN_IMPORT_SECONDS
    return seconds if 0 < seconds < math.inf else PLUGIN_IMPORT_SECONDS


def load_plugin(pm: pluggy.PluginManager, package_label: str, ep) -> None:
    """Import one entry point, within plugin_import_seconds(), and register it; a hook name that
    no spec declares (a typo) is refused here, naming the closest hook, as pluggy's
    check_pending would."""
    seconds = plugin_import_seconds()
    try:
        plugin = call_within(seconds, ep.load, name=f"import of plugin {ep.name}")
    except TimedOut:
        raise TimedOut(f"its import did not return within {seconds:g} s (it goes on in the background; set "
                       "WORKBENCH_PLUGIN_IMPORT_SECONDS to wait longer)") from None
    pm.register(plugin, name=ep.name)
    unknown = [hc.name for hc in pm.get_hookcallers(plugin) or [] if not hc.has_spec()]
    if unknown:
        pm.unregister(plugin)
        raise pluggy.PluginValidationError(
            plugin, f"unknown hook {unknown[0]!r}" + suggest_hook(unknown[0]))
    PROVIDERS[getattr(plugin, "__name__", ep.value)] = package_label
    PACKAGE_OF_PLUGIN[ep.name] = package_label


HOOKS = [*HOOK_OF_AXIS.values(), "register_study_kinds"]  # every hook of workbench.hookspecs


def suggest_hook(name: str) -> str:
    hint = closest(name, HOOKS)
    return f"; did you mean {hint!r}?" if hint else f" (valid: {', '.join(HOOKS)})"


def first_line(err: BaseException) -> str:
    if isinstance(err, TimedOut):
        return str(err)
    return f"{type(err).__name__}: {str(err).splitlines()[0][:200] if str(err) else ''}".rstrip(": ")


@functools.cache
def plugin_manager() -> pluggy.PluginManager:
    """Every plugin declared by an installed package, the built-ins' first. One that fails to
    import (whatever it raises: SystemExit and KeyboardInterrupt too), misspells a hook or takes
    the entry point name of one loaded before it (a built-in's: `position_rope`) is left out
    with one PluginLoadWarning naming its package and the error, so a broken third-party
    package never takes the built-ins (or any command) down with it; so is one whose import
    does not return within plugin_import_seconds() (a plugin that hangs at import)."""
    pm = pluggy.PluginManager(ENTRY_POINT_GROUP)
    pm.add_hookspecs(hookspecs)
    PACKAGE_OF_PLUGIN.clear()  # of this manager's plugins only
    entry_points = sorted(workbench_entry_points(), key=lambda pair: pair[0].split(" ")[0] != BUILTIN_DISTRIBUTION)
    for package_label, ep in entry_points:
        label = f"plugin {ep.name!r} of package {package_label}"
        if pm.is_blocked(ep.name) or PACKAGE_OF_PLUGIN.get(ep.name) == package_label:
            continue  # a distribution listed twice on the path
        if pm.has_plugin(ep.name):
            warnings.warn(f"{label} not loaded: its entry point name is that of plugin {ep.name!r} of package "
                          f"{PACKAGE_OF_PLUGIN.get(ep.name, '?')}, which it may not replace; rename its entry point",
                          PluginLoadWarning, stacklevel=2)
            continue
        try:
            load_plugin(pm, package_label, ep)
        except BaseException as err:  # noqa: BLE001 - anything someone else's import raises, SystemExit too
            warnings.warn(f"{label} not loaded: {first_line(err)}", PluginLoadWarning, stacklevel=2)
    pm.check_pending()  # plugins registered by hand later are checked where they register
    return pm


def hook_results(hook: str, problem_of: Callable[[Any], str | None]) -> list[Any]:
    """Every plugin's items from `hook`, in the order the plugins registered. A plugin whose hook
    raises or returns something other than a list is left out, and an item `problem_of` finds
    fault with is left out, each with one PluginLoadWarning naming the plugin and its package."""
    pm = plugin_manager()
    items = []
    for impl in getattr(pm.hook, hook).get_hookimpls():
        name = pm.get_name(impl.plugin)
        label = f"plugin {name!r}" + (f" of package {PACKAGE_OF_PLUGIN[name]}" if name in PACKAGE_OF_PLUGIN else "")
        try:
            returned = impl.function()
        except BaseException as err:  # noqa: BLE001 - someone else's code, as at import
            warnings.warn(f"{label}: {hook}() failed ({first_line(err)}); left out", PluginLoadWarning, stacklevel=2)
            continue
        if not isinstance(returned, (list, tuple)):
            warnings.warn(f"{label}: {hook}() returned {short(returned)}, not a list of classes; left out",
                          PluginLoadWarning, stacklevel=2)
            continue
        faults = [(item, problem) for item in returned if (problem := checked(problem_of, item))]
        if faults:
            (item, problem), others = faults[0], len(faults) - 1
            warnings.warn(f"{label}: {hook}() returned {short(item)}, {problem}"
                          + (f" (and {others} more such item{'s' * (others > 1)})" if others else "")
                          + "; left out", PluginLoadWarning, stacklevel=2)
        bad = {id(item) for item, _ in faults}
        items += [item for item in returned if id(item) not in bad]
    return items


def checked(problem_of: Callable[[Any], str | None], item: Any) -> str | None:
    try:
        return problem_of(item)
    except Exception as err:  # noqa: BLE001 - an object whose attributes raise when read
        return f"which cannot be inspected ({first_line(err)})"


def short(value: Any) -> str:
    try:
        text = value.__qualname__ if isinstance(value, type) else repr(value)
    except Exception:  # noqa: BLE001 - a repr that raises
        text = f"an object of type {type(value).__name__}"
    return text if len(text) <= 60 else text[:57] + "..."


def variant_problem(axis: str) -> Callable[[Any], str | None]:
    """What is wrong with an item a plugin registers for `axis` (None: nothing)."""

    def problem(item: Any) -> str | None:
        if not isinstance(item, type) or not issubclass(item, Variant):
            return f"which is not a {NOUN_OF_AXIS[axis]} class (a subclass of the workbench's base class)"
        if getattr(item, "axis", None) != axis:
            return f"a class of axis {getattr(item, 'axis', None)!r}, registered as {axis}"
        if not isinstance(getattr(item, "name", None), str) or not item.name:
            return "a class without a `name`"
        return None

    return problem


@functools.cache
def variants(axis: str) -> dict[str, type]:
    """Every registered variant of one axis, by name."""
    if axis not in AXES:
        raise ValueError(f"unknown axis {axis!r}; axes are {AXES}")
    found: dict[str, type] = {}
    # Built-ins first, so that an installed package that reuses a name overrides the built-in.
    classes = hook_results(HOOK_OF_AXIS[axis], variant_problem(axis))
    classes.sort(key=lambda cls: not cls.__module__.startswith(BUILTIN_PACKAGE))
    for cls in classes:
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
    """The installed package a variant comes from, as pip names it, with its version."""
    plugin_manager()
    module = cls.__module__
    if module in PROVIDERS:
        return PROVIDERS[module]
    package = module.split(".")[0]  # a class defined in another module of the plugin's package
    return next((dist for name, dist in PROVIDERS.items() if name.split(".")[0] == package), module)


def provider(axis: str, name: str) -> str:
    """`name` with the package that provides it: 'rope (transformer-workbench 0.1.0)'."""
    return f"{name} ({distribution_of(get_variant(axis, name))})"


def run_variants(config: dict) -> list[tuple[str, str]]:
    """(axis, name) of every variant one resolved run config uses: each model axis (every variant
    of a per-layer pattern), the task and the optimizer."""
    used = [(axis, name) for axis in MODEL_AXES for name in variant_names(config["model"], axis)]
    optimizer = config.get("train", {}).get("optimizer", {"name": "adamw"})
    return [*used, ("task", config["task"]["name"]), ("optimizer", optimizer["name"])]


def run_providers(config: dict) -> dict[str, str]:
    """The package behind each variant, the task and the optimizer of one resolved run config,
    keyed `variant.<axis>` ("a (pkg 1.0), b (pkg 1.0)" for a per-layer pattern), and the digest of
    the code of each one installed from another package than the workbench, keyed
    `code.<axis>.<name>`: recorded in the run's environment, and compared on resume, so a plugin
    that starts to provide a name, a new version of one, or an edit of an installed plugin's code
    (an editable install keeps its version) is seen, not silently mixed in."""
    out: dict[str, str] = {}
    for axis, name in run_variants(config):
        key = f"variant.{axis}"
        out[key] = f"{out[key]}, {provider(axis, name)}" if key in out else provider(axis, name)
        digest = code_digest(get_variant(axis, name))
        if digest is not None:
            out[f"code.{axis}.{name}"] = digest
    return out


def code_digest(cls: type) -> str | None:
    """sha256 (12 hex digits) of the source files of the modules that define `cls` and the classes
    it derives from within its own top-level package; None for the workbench's own variants (its
    version and commit say which code they are) and where no source file is found."""
    if distribution_of(cls).split(" ")[0] == BUILTIN_DISTRIBUTION:
        return None
    top = cls.__module__.split(".")[0]
    modules = sorted({klass.__module__ for klass in cls.__mro__ if klass.__module__.split(".")[0] == top})
    digest = hashlib.sha256()
    for name in modules:
        try:
            path = inspect.getsourcefile(sys.modules[name])
            with open(path, "rb") as file:
                digest.update(name.encode() + b"\0" + file.read())
        except (KeyError, TypeError, OSError):  # a module made at run time, or without a file
            return None
    return digest.hexdigest()[:12]
