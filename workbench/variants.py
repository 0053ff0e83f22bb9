"""What every pluggable variant declares: an axis, a name and typed parameters.

A variant's `Params` (a pydantic model) is the one place its parameters are declared:
YAML validation, `workbench list` and reports all read them from there.
"""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict

from workbench.fields import StrictModel

AXES = ("position", "attention", "norm", "ffn", "task")


class Params(StrictModel):
    """Base of every variant's parameter model: unknown keys are errors, values are frozen."""

    model_config = ConfigDict(extra="forbid", frozen=True)


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
