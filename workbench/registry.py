"""Finds variants through pluggy: every plugin, built-in or third-party, comes in by entry point."""

from __future__ import annotations

import functools
import importlib.metadata
import warnings

import pluggy

from workbench import hookspecs
from workbench.errors import WorkbenchWarning, closest, unknown_name
from workbench.variants import AXES, AXIS, MODEL_AXES

ENTRY_POINT_GROUP = "workbench"
BUILTIN_PACKAGE = "workbench_plugins."  # plugins/, as installed

HOOK_OF_AXIS = {name: axis.hook for name, axis in AXIS.items()}
NOUN_OF_AXIS = {name: axis.noun for name, axis in AXIS.items()}


class PluginLoadWarning(WorkbenchWarning):
    """An installed plugin could not be loaded; it is left out and everything else works."""


# Plugin module name -> "distribution version" of the package that declared it.
PROVIDERS: dict[str, str] = {}


def workbench_entry_points():
    """(distribution, entry point) for every entry point in the `workbench` group."""
    for dist in importlib.metadata.distributions():
        for ep in dist.entry_points:
            if ep.group == ENTRY_POINT_GROUP:
                yield dist, ep


def load_plugin(pm: pluggy.PluginManager, dist, ep) -> None:
    """Import one entry point and register it; a hook name that no spec declares (a typo)
    is refused here, naming the closest hook, as pluggy's check_pending would."""
    plugin = ep.load()
    pm.register(plugin, name=ep.name)
    unknown = [hc.name for hc in pm.get_hookcallers(plugin) or [] if not hc.has_spec()]
    if unknown:
        pm.unregister(plugin)
        raise pluggy.PluginValidationError(
            plugin, f"unknown hook {unknown[0]!r}" + suggest_hook(unknown[0]))
    PROVIDERS[getattr(plugin, "__name__", ep.value)] = f"{dist.metadata['name']} {dist.version}"


HOOKS = [*HOOK_OF_AXIS.values(), "register_study_kinds"]  # every hook of workbench.hookspecs


def suggest_hook(name: str) -> str:
    hint = closest(name, HOOKS)
    return f"; did you mean {hint!r}?" if hint else f" (valid: {', '.join(HOOKS)})"


@functools.cache
def plugin_manager() -> pluggy.PluginManager:
    """Every plugin declared by an installed package. One that fails to import or misspells a
    hook is left out with one PluginLoadWarning naming its package and the error, so a broken
    third-party package never takes the built-ins (or any command) down with it."""
    pm = pluggy.PluginManager(ENTRY_POINT_GROUP)
    pm.add_hookspecs(hookspecs)
    for dist, ep in workbench_entry_points():
        if pm.has_plugin(ep.name) or pm.is_blocked(ep.name):
            continue
        try:
            load_plugin(pm, dist, ep)
        except Exception as err:  # noqa: BLE001 - any error in someone else's package
            problem = str(err).splitlines()[0] if str(err) else ""
            warnings.warn(f"plugin {ep.name!r} of package {dist.metadata['name']} {dist.version} not loaded: "
                          f"{type(err).__name__}: {problem}", PluginLoadWarning, stacklevel=2)
    pm.check_pending()  # plugins registered by hand later are checked where they register
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


def run_providers(config: dict) -> dict[str, str]:
    """The package behind each variant and the task of one resolved run config, keyed
    `variant.<axis>`: recorded in the run's environment, and compared on resume, so a plugin
    that starts to provide a name (or a new version of one) is seen, not silently mixed in."""
    names = {axis: config["model"][axis]["name"] for axis in MODEL_AXES}
    names["task"] = config["task"]["name"]
    return {f"variant.{axis}": provider(axis, name) for axis, name in names.items()}
