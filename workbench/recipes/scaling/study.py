"""The scaling study file (`kind: scaling`): a model, a sweep over `model.*` keys and the
`scaling:` section (workbench.recipes.scaling.measuring.ScalingSection: lengths, modes, limits).

    name: attention-cost
    kind: scaling
    model: {d_model: 256, n_heads: 4, n_layers: 1, position: none}
    sweep: {model.attention: [full, naive, {name: sliding_window, window: 256}]}
    scaling: {lengths: [1024, 2048, 4096, 8192], modes: [forward, train_step], scope: layer}
"""

from __future__ import annotations

import copy
from typing import Annotated, Any, Literal

from pydantic import Field, WithJsonSchema, model_validator

from workbench.errors import SpecError
from workbench.model.spec import parse_spec
from workbench.recipes.scaling.measuring import ScalingSection
from workbench.study import StudyBase, check_key
from workbench.study.keys import set_dotted
from workbench.study.sections import SWEEP_JSON_SCHEMA, Sweep


class ScalingStudy(StudyBase):
    """Measure cost against sequence length for every sweep point."""

    kind: Literal["scaling"] = Field("scaling", description="scaling: cost against sequence length")
    model: Annotated[dict[str, Any], WithJsonSchema({"x-section": "ModelSection"})] = Field(
        default_factory=dict, description="the model spec (see the README)")
    sweep: Annotated[Sweep, WithJsonSchema(SWEEP_JSON_SCHEMA)] = Field(default_factory=Sweep)
    scaling: ScalingSection


    @model_validator(mode="after")
    def _checks(self):
        for key in self.sweep.keys:
            if not key.startswith("model."):
                raise SpecError(self.sweep.field(key), f"a scaling study sweeps model keys only, got {key!r}",
                                ["model.<field>"])
            check_key(key, self.sweep.field(key), task={})
        for model in self.models():
            if "decode" in self.scaling.modes and model["family"] != "decoder":
                raise SpecError("scaling.modes", f"decode needs a decoder model (family is {model['family']!r})")
        return self

    def sweep_points(self) -> list[dict[str, Any]]:
        return self.sweep.points()

    def model_of(self, point: dict[str, Any]) -> dict[str, Any]:
        """The resolved model spec of one sweep point; a SpecError names the swept field."""
        raw = {"model": copy.deepcopy(self.model)}
        for key, value in point.items():
            set_dotted(raw, key, value)
        try:
            return parse_spec(raw["model"]).resolved()
        except SpecError as err:
            field = self.sweep.field(err.field) if err.field in point else err.field
            raise SpecError(field, err.problem, err.choices) from None

    def models(self) -> list[dict[str, Any]]:
        return [self.model_of(point) for point in self.sweep_points()]

    def run_defining(self) -> dict[str, Any]:
        execution = {"time_budget_s", "memory_limit_gb", "device", "threads", "isolate"}
        return {"kind": self.kind, "model": self.model, "sweep": self.sweep.model_dump(), "seeds": self.seeds,
                "scaling": self.scaling.model_dump(exclude=execution)}
