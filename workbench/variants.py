"""What every pluggable variant declares: an axis, a name and typed parameters.

A variant's `Params` (a pydantic model) is the one place its parameters are declared:
YAML validation, `workbench list` and reports all read them from there. Every such model
(and every other model of a study file) is a StrictModel: whole numbers strict and bounded,
floats finite.
"""

from __future__ import annotations

import math
import types
import typing
from collections.abc import Mapping
from typing import Any, ClassVar, NamedTuple

from pydantic import BaseModel, ConfigDict, model_validator


class Axis(NamedTuple):
    """One kind of pluggable choice, as `workbench list`, errors and the plugin scaffold name it."""

    noun: str  # one variant of it, in words
    hook: str  # the hook its plugins register through (workbench.hookspecs)
    # An axis added after runs were stored: its default variant, which a stored model mapping
    # leaves out (ModelSpec.resolved), so the ids of the runs stored before it stay unchanged.
    absent_means: str | None = None


# Every axis, written once: the model's (each a `model:` field naming a variant), then the task.
AXIS = {
    "position": Axis("position scheme", "register_position_schemes"),
    "attention": Axis("attention variant", "register_attention_variants"),
    "norm": Axis("norm placement", "register_norm_placements"),
    "ffn": Axis("FFN type", "register_ffn_types"),
    "residual": Axis("residual connection", "register_residual_connections", absent_means="plain"),
    "task": Axis("task", "register_tasks"),
    "optimizer": Axis("optimizer", "register_optimizers"),  # train.optimizer
}
AXES = tuple(AXIS)
MODEL_AXES = tuple(axis for axis in AXES if axis not in ("task", "optimizer"))


def variant_names(model: Mapping[str, Any], axis: str) -> list[str]:
    """The variants of a model axis that a stored (resolved) model mapping names: one, or each
    distinct one of a per-layer pattern (a list, or {repeat: [...]}); KeyError or TypeError when
    it names none and the axis is not one added later (a damaged mapping)."""
    if axis not in model and AXIS[axis].absent_means is not None:
        return [AXIS[axis].absent_means]
    value = model[axis]
    items = value["repeat"] if isinstance(value, Mapping) and "repeat" in value else value
    if isinstance(items, list):
        return list(dict.fromkeys(str(item["name"]) for item in items))
    return [str(value["name"])]


# ---- StrictModel: the base of every model a study file (and a stored study) is validated with
#
# pydantic's lax mode takes `steps: true` as 1 and any int however large (a 4000-digit `steps`
# passed `validate` and overflowed at run time); its strict mode would refuse too much that a
# YAML file legitimately holds (a list for a tuple, text for an enum). StrictModel keeps lax
# mode and checks, before each field is validated, what lax mode lets through: a boolean
# where a whole number is expected, a whole number outside the signed 64-bit range (what
# SQLite, NumPy and torch hold), a float that is not finite.

MAX_INT = 2**63 - 1


def leaves(annotation: Any) -> list[Any]:
    """The types a field accepts at its top level: Optional, unions and Annotated unwrapped."""
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        return leaves(typing.get_args(annotation)[0])
    if origin in (typing.Union, types.UnionType):
        return [leaf for arg in typing.get_args(annotation) for leaf in leaves(arg)]
    return [annotation]


def check_value(value: Any, annotation: Any) -> None:
    """ValueError for what lax mode would wrongly accept for `annotation`; containers of
    whole numbers or floats are checked item by item."""
    accepted = leaves(annotation)
    if isinstance(value, bool):
        if int in accepted and bool not in accepted:
            raise ValueError(f"expected a whole number, got {str(value).lower()} (a boolean)")
        return
    if isinstance(value, int) and (int in accepted or float in accepted) and abs(value) > MAX_INT:
        raise ValueError(f"a number of {len(str(abs(value)))} digits is too large (at most {MAX_INT})")
    if isinstance(value, float) and float in accepted and not math.isfinite(value):
        raise ValueError(f"Input should be a finite number (got {value})")
    for leaf in accepted:
        origin, args = typing.get_origin(leaf), typing.get_args(leaf)
        if origin in (list, tuple, set, frozenset) and isinstance(value, (list, tuple)) and args:
            items = args[:1] * len(value) if origin is not tuple or args[-1] is Ellipsis else args
            for item, item_type in zip(value, items):
                check_value(item, item_type)
        elif origin is dict and isinstance(value, dict) and len(args) == 2:
            for item in value.values():
                check_value(item, args[1])


class FieldError(ValueError):
    """A problem with one field, named relative to the model that raised it: pydantic locates
    the model, workbench.model.spec.spec_error_from puts that path in front."""

    def __init__(self, field: str, problem: str):
        self.field, self.problem = field, problem
        super().__init__(f"{field}: {problem}")


class StrictModel(BaseModel):
    """A pydantic model whose whole numbers are strict and bounded and floats finite. A model
    validator, not a field validator: pydantic allows none before a discriminator field."""

    @model_validator(mode="before")
    @classmethod
    def _strict_numbers(cls, data: Any) -> Any:
        if isinstance(data, Mapping):
            for name, field in cls.model_fields.items():
                key = next((k for k in (name, field.alias) if k is not None and k in data), None)
                if key is not None:
                    try:
                        check_value(data[key], field.annotation)
                    except ValueError as err:
                        raise FieldError(key, str(err)) from None
        return data


class Params(StrictModel):
    """Base of every variant's parameter model: unknown keys are errors, values are frozen."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    # Parameters added after runs were stored: left out of the stored mapping while they hold
    # their default (`without_later_defaults`), so the ids of runs made before them stay unchanged.
    added_later: ClassVar[tuple[str, ...]] = ()


def without_later_defaults(model: BaseModel, dumped: dict[str, Any]) -> dict[str, Any]:
    """`dumped` (model's model_dump) without the fields of `added_later` (of its class and of every
    base class: a subclass adds its own) at their default."""
    later = {name for klass in type(model).__mro__ for name in vars(klass).get("added_later", ())}
    fields = type(model).model_fields
    return {k: v for k, v in dumped.items() if not (k in later and v == fields[k].default)}


class Variant:
    """Mixin for a registered variant class."""

    axis: ClassVar[str]
    name: ClassVar[str]
    Params: ClassVar[type[Params]] = Params

    @classmethod
    def summary(cls) -> str:
        return (cls.__doc__ or "").strip().splitlines()[0] if cls.__doc__ else ""

    @classmethod
    def declared_parameters(cls) -> list[dict[str, Any]]:
        """Name, type, default and help of each parameter, for listings and reports.
        (Not `parameters`: variants are nn.Modules, whose `parameters()` yields tensors.)"""
        rows = []
        for name, field in cls.Params.model_fields.items():
            annotation = field.annotation
            type_name = getattr(annotation, "__name__", None) or str(annotation).replace("typing.", "")
            rows.append(
                {
                    "name": name,
                    "type": type_name,
                    "default": None if field.is_required() else field.default,
                    "required": field.is_required(),
                    "help": field.description or "",
                }
            )
        return rows
