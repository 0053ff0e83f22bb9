"""The base of every model a study file (and a stored study) is validated with: its whole
numbers are typed strictly and bounded, its floats finite.

pydantic's lax mode takes `steps: true` as 1 and any int however large (a 4000-digit `steps`
passed `validate` and overflowed at run time); its strict mode would refuse too much that a
YAML file legitimately holds (a list for a tuple, text for an enum). StrictModel keeps lax
mode and checks, before each field is validated, what lax mode lets through: a boolean
where a whole number is expected, a whole number outside the signed 64-bit range (what
SQLite, NumPy and torch hold), a float that is not finite.
"""

from __future__ import annotations

import math
import types
import typing
from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, model_validator

from workbench.errors import SpecError

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
        raise ValueError(f"expected a finite number, got {value}")
    for leaf in accepted:
        origin, args = typing.get_origin(leaf), typing.get_args(leaf)
        if origin in (list, tuple, set, frozenset) and isinstance(value, (list, tuple)) and args:
            items = args[:1] * len(value) if origin is not tuple or args[-1] is Ellipsis else args
            for item, item_type in zip(value, items):
                check_value(item, item_type)
        elif origin is dict and isinstance(value, dict) and len(args) == 2:
            for item in value.values():
                check_value(item, args[1])


class FieldError(SpecError):
    """A SpecError whose field is relative to the model that raised it (pydantic locates it:
    workbench.model.spec.spec_error_from puts the path in front)."""


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
