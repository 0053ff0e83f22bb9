"""The sections of a study file that are plain settings: `expect:`, `seeds:`, `sweep:` and
`tune:` (`train:` is workbench.study.train_section)."""

from __future__ import annotations

import itertools
import math
from datetime import datetime
from collections.abc import Mapping
from typing import Any, Literal

from pydantic import ConfigDict, Field, model_validator

from workbench.errors import SpecError
from workbench.stats.outcomes import Outcome
from workbench.study.yaml_file import limit, suggest
from workbench.variants import StrictModel


class Target(StrictModel):
    """The score a `*_to_target` expectation waits for."""

    model_config = ConfigDict(extra="forbid")
    metric: str = Field(description="metric@eval_length the evaluations are read on (e.g. bpc@64)")
    value: float = Field(allow_inf_nan=False, description="the score to reach (at least it, or at most it when lower is better)")


class Expectation(StrictModel):
    """A claim the report checks: `better` is expected to beat `than` on `metric`."""

    model_config = ConfigDict(extra="forbid")
    metric: str = Field(description="metric[@eval_length] (e.g. accuracy@64, loss), a run measure (tokens_per_s), or "
                        "flops_to_target / tokens_to_target / seconds_to_target with a `target` (lower is better)")
    target: Target | None = Field(None, description="for *_to_target: {metric: metric@length, value: score}")
    better: Any = Field(description="the swept value (or {dotted.key: value}) expected to be better")
    than: Any = Field(description="the swept value (or {dotted.key: value}) it is compared against")
    claim: str | None = Field(None, description="id of the claim it tests (e.g. E6)")
    margin: float | None = Field(None, gt=0, description="smallest difference of interest: an interval inside "
                                 f"±margin reads '{Outcome.EQUIVALENT}' (two one-sided tests)")
    note: str = Field("", description="free text shown with the verdict")
    direction: Literal["lower", "higher"] | None = Field(
        None, description="for a descriptive measure only (attention_entropy, first_token_attention), which has no "
                          "better direction of its own: the way the claim expects `better` to differ from `than` (the "
                          "verdict reads 'lower than' / 'higher than')")
    than_predicted: str | None = Field(
        None, description="the level the claim predicts for `than`, one of the task's baselines (e.g. side-blind): a "
                          "verdict that holds with `than` below it says so (it fell short for more than the claimed "
                          "reason)")
    registered: datetime | None = Field(
        None, description="when the margin was written (UTC, e.g. 2026-12-01 09:30; the commit that introduced it): "
                          "after the study's first result, the verdict reads 'post hoc'")
    post_hoc: bool | None = Field(
        None, description="for a report that records no first-result time (issued before it was recorded): "
                          "whether the margin was written after the study's results, from the project's history")


class SeedPlan(StrictModel):
    """`seeds: {first: 3, max: 20}`: every group runs `first` seeds; groups in comparisons
    still undecided get more, in rounds, up to `max`, unless more cannot decide them
    (workbench.stats.sequential.LOOKS, `futility`).
    `start` moves the seed ids, so that a study registered to replicate an earlier one runs on
    seeds that one never ran (the same seeds would reproduce its numbers, not test them)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    first: int = Field(ge=2, description="seeds every group runs (seed ids start .. start+first-1)")
    max: int = Field(description="most seeds a group runs; each look tests at the alpha spent at it")
    # below 2^31 less room for max and tuning seeds, so every seed stays within what numpy takes (2^32-1)
    start: int = Field(0, ge=0, le=2**31 - 2000, description="the first seed id (default 0)")

    @model_validator(mode="after")
    def _ordered(self):
        if self.max <= self.first:
            raise SpecError("seeds.max", f"{self.max} must exceed first ({self.first}): adaptive seeds add to the first ones")
        if self.max > 1000:
            raise SpecError("seeds.max", f"{self.max}: at most 1000 seeds per group")
        return self

    @property
    def seeds(self) -> list[int]:
        """Every seed a group may run, in order."""
        return list(range(self.start, self.start + self.max))

    @property
    def first_seeds(self) -> list[int]:
        """The seeds every group runs before the first look."""
        return self.seeds[: self.first]


SEEDS_JSON_SCHEMA = {
    "anyOf": [
        {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 2**32 - 1}, "minItems": 1},
        {"type": "object", "properties": {"first": {"type": "integer", "minimum": 2}, "max": {"type": "integer"},
                                          "start": {"type": "integer", "minimum": 0, "maximum": 2**31 - 2000}},
         "required": ["first", "max"], "additionalProperties": False,
         "description": "adaptive: every group runs `first` seeds; groups in undecided comparisons get more, up to `max`"},
    ],
    "description": "every sweep point trains once per seed (0 .. 2^32-1), or {first: N, max: M} for adaptive seeds",
}

ZIP_GROUP = {"type": "object", "additionalProperties": {"type": "array", "minItems": 1}}
SWEEP_JSON_SCHEMA = {
    "type": "object",
    "description": "dotted.key: [values] (a grid over every key); `zip: {key: [...], key2: [...]}` (or a list of "
    "such groups) for keys that vary together (lists of equal length)",
    "properties": {
        "zip": {  # one group, or a list of groups, as the loader accepts
            "anyOf": [{"type": "array", "items": ZIP_GROUP}, ZIP_GROUP],
        }
    },
    "additionalProperties": {"type": "array", "minItems": 1},
}


class Sweep(StrictModel):
    """The sweep as a grid over `grid` keys times each `zip` group (keys that vary together)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    grid: dict[str, list[Any]] = {}
    zip: list[dict[str, list[Any]]] = []

    @model_validator(mode="before")
    @classmethod
    def _from_yaml(cls, data: Any) -> Any:
        if isinstance(data, Sweep):
            return data
        if data is None:
            return {}
        if not isinstance(data, Mapping):
            raise SpecError("sweep", f"expected a mapping of dotted keys to lists, got {data!r}")
        if set(data) == {"grid", "zip"}:  # our own model_dump(), e.g. a study read back from a store
            return dict(data)
        data = dict(data)
        groups = data.pop("zip", [])
        if isinstance(groups, Mapping):
            groups = [groups]
        if not isinstance(groups, list) or not all(isinstance(g, Mapping) for g in groups):
            raise SpecError("sweep.zip", "expected a list of mappings {dotted.key: [values]}")
        for key, values in data.items():
            check_values(f"sweep.{key}", values)
        seen = set(data)
        for i, group in enumerate(groups):
            lengths = {key: check_values(f"sweep.zip.{i}.{key}", values) for key, values in group.items()}
            if len(set(lengths.values())) > 1:
                sizes = ", ".join(f"{k}: {n}" for k, n in lengths.items())
                raise SpecError(f"sweep.zip.{i}", f"zipped lists must have equal lengths ({sizes})")
            for key in group:
                if key in seen:
                    raise SpecError(f"sweep.zip.{i}.{key}", "key is swept twice")
                seen.add(key)
        return {"grid": data, "zip": [dict(g) for g in groups]}

    @property
    def keys(self) -> list[str]:
        return [*self.grid, *(k for group in self.zip for k in group)]

    def size(self) -> int:
        """The number of points, without expanding them."""
        return math.prod([len(v) for v in self.grid.values()] + [len(next(iter(g.values()))) for g in self.zip if g])

    def points(self) -> list[dict[str, Any]]:
        """Every combination of swept values as {dotted.key: value} (one {} when nothing is swept):
        the grid's product, times each zip group's aligned rows."""
        if self.size() > limit("WORKBENCH_MAX_RUNS"):
            raise SpecError("sweep", f"{self.size()} sweep points, over the limit of {limit('WORKBENCH_MAX_RUNS')}; "
                            "sweep fewer values, or set WORKBENCH_MAX_RUNS to allow it")
        axes = [[{key: v} for v in values] for key, values in self.grid.items()]
        for group in self.zip:
            n = len(next(iter(group.values())))
            axes.append([{key: values[i] for key, values in group.items()} for i in range(n)])
        return [{key: value for part in combo for key, value in part.items()} for combo in itertools.product(*axes)]

    def values(self, key: str) -> list[Any]:
        if key in self.grid:
            return self.grid[key]
        return next(group[key] for group in self.zip if key in group)

    def field(self, key: str) -> str:
        """The YAML field path where `key` is swept (for line numbers)."""
        if key in self.grid:
            return f"sweep.{key}"
        return next(f"sweep.zip.{i}.{key}" for i, g in enumerate(self.zip) if key in g)


TUNE_OPTIONS = ("metric", "seeds")
TUNE_JSON_SCHEMA = {
    "anyOf": [
        {
            "type": "object",
            "description": "choose a value per sweep point before its seeds run: {dotted.key: [candidate values] "
            "(train.* or model.*; several keys: a grid), metric: metric@eval_length scored on validation sets, "
            "seeds: N (tuning runs per value: the study's first N seeds)}",
            "properties": {
                "metric": {"type": "string", "description": "metric@eval_length to select by (e.g. loss@16)"},
                "seeds": {"type": "integer", "minimum": 1, "default": 1,
                          "description": "tuning runs per candidate value (the study's first N seeds)"},
            },
            "patternProperties": {r"^(train|model)\.": {"type": "array", "minItems": 1}},
            "required": ["metric"],
            "additionalProperties": False,
        },
        {"type": "null"},
    ]
}


class Tune(StrictModel):
    """A study's `tune:` section: each sweep point picks its own values of `values`' keys (a
    grid over them), the best mean `metric` over `seeds` tuning runs per candidate, scored on
    validation sets; then its seeds run at that value (workbench.recipes.train.tuning)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    values: dict[str, list[Any]]
    metric: str = Field(description="metric@eval_length the choice is made by (its direction comes from the task)")
    seeds: int = Field(1, gt=0, description="tuning runs per candidate value: the study's first N seeds")

    @model_validator(mode="before")
    @classmethod
    def _from_yaml(cls, data: Any) -> Any:
        if not isinstance(data, Mapping):
            raise SpecError("tune", "expected a mapping {dotted.key: [values], metric: metric@length, seeds: N}, "
                            f"got {data!r}")
        if set(data) == {"values", *TUNE_OPTIONS}:  # our own model_dump(), e.g. a study read back from a store
            return dict(data)
        for key in data:
            if "." not in str(key) and key not in TUNE_OPTIONS:
                choices = [*TUNE_OPTIONS, "train.<field>", "model.<field>"]
                raise SpecError(f"tune.{key}", "unknown key" + suggest(str(key), list(TUNE_OPTIONS)), choices)
        values = {str(k): v for k, v in data.items() if "." in str(k)}
        if not values:
            raise SpecError("tune", "name the keys to tune with their candidate values, "
                            "e.g. tune: {train.lr: [1.0e-3, 3.0e-3, 1.0e-2], metric: loss@16}")
        for key, candidates in values.items():
            if not isinstance(candidates, list):
                raise SpecError(f"tune.{key}", f"a tuned key takes a list of candidate values, got {candidates!r}")
            if not candidates:
                raise SpecError(f"tune.{key}", "empty list: give the candidate values to choose from")
        return {"values": values, **{k: v for k, v in data.items() if "." not in str(k)}}

    @property
    def keys(self) -> list[str]:
        return list(self.values)

    def points(self) -> list[dict[str, Any]]:
        """Every combination of candidate values as {dotted.key: value}, in the file's order."""
        return [dict(zip(self.values, combo)) for combo in itertools.product(*self.values.values())]


def check_values(field: str, values: Any) -> int:
    if not isinstance(values, list):
        raise SpecError(field, f"a sweep key takes a list of values, got {values!r}")
    if not values:
        raise SpecError(field, "empty sweep list: give at least one value")
    return len(values)
