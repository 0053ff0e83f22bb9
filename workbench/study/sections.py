"""The sections of a study file that are plain settings: `train:`, `expect:`, `sweep:` and `tune:`."""

from __future__ import annotations

import itertools
import math
import re
from collections.abc import Mapping
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from workbench.cost.budget import BUDGET_STEP_CAP, StepCost, estimated_steps
from workbench.errors import SpecError
from workbench.study.yaml_file import limit, suggest


# Lightning's registered strategy names, by their first word (ddp_spawn, deepspeed_stage_2, ...);
# tests/test_reliability.py checks them against Lightning's StrategyRegistry.
LIGHTNING_STRATEGIES = ("auto", "ddp", "deepspeed", "fsdp", "single", "xla")


BUDGET_KINDS = ("flops", "tokens", "seconds")


class Budget(BaseModel):
    """A training budget in compute (workbench.cost.budget): exactly one of its fields."""

    model_config = ConfigDict(extra="forbid")
    flops: float | None = Field(None, gt=0, allow_inf_nan=False,
                                description="counted training FLOPs per run (useful FLOPs, x3 of the forward): each "
                                "run derives its steps from its own cost per step")
    tokens: int | None = Field(None, gt=0, description="real (non-padding) training tokens per run")
    seconds: float | None = Field(None, gt=0, allow_inf_nan=False,
                                  description="training seconds per run (evaluation excluded); needs train.eval_every")

    @model_validator(mode="after")
    def _exactly_one(self):
        given = [k for k in BUDGET_KINDS if getattr(self, k) is not None]
        if len(given) != 1:
            raise SpecError("train.budget", f"give exactly one budget, got {len(given)}"
                            + (f" ({', '.join(given)})" if given else ""), list(BUDGET_KINDS))
        return self

    @property
    def kind(self) -> str:
        return next(k for k in BUDGET_KINDS if getattr(self, k) is not None)

    @property
    def amount(self) -> float:
        return getattr(self, self.kind)

    def text(self) -> str:
        """'2e+10 FLOPs', '1,000,000 tokens', '60 s'."""
        unit = {"flops": "FLOPs", "tokens": "tokens", "seconds": "s"}[self.kind]
        return f"{self.amount:,} {unit}" if self.kind == "tokens" else f"{self.amount:.4g} {unit}"


class TrainConfig(BaseModel):
    """How each run trains. Execution fields (where and how it runs) do not change a run's id."""

    model_config = ConfigDict(extra="forbid")
    EXECUTION: ClassVar[tuple[str, ...]] = (
        "accelerator", "devices", "strategy", "num_nodes", "logger", "checkpoint_every", "eval_batch_size",
    )
    # Opt-in measurements: part of a run's id and a study's hash only when switched on, so studies
    # that never set them keep the ids and hashes they always had.
    OPT_IN: ClassVar[tuple[str, ...]] = ("attention_entropy", "budget")

    steps: int | None = Field(None, gt=0, description="optimizer steps per run (give steps, tokens or budget)")
    tokens: int | None = Field(
        None, gt=0, description="training tokens per run: steps = ceil(tokens / (batch_size * task.train_length))"
    )
    batch_size: int = Field(32, gt=0, description="sequences per optimizer step")
    lr: float = Field(1e-3, gt=0, allow_inf_nan=False, description="peak learning rate (AdamW)")
    weight_decay: float = Field(0.01, ge=0, allow_inf_nan=False, description="AdamW decay on weight matrices (not norms or biases)")
    warmup_steps: int = Field(0, ge=0, description="linear warmup from 0 to lr")
    schedule: Literal["cosine", "linear", "constant"] = Field("cosine", description="decay after warmup")
    min_lr_ratio: float = Field(0.1, ge=0, le=1, description="final lr / peak lr for cosine and linear decay")
    grad_clip: float | None = Field(1.0, gt=0, allow_inf_nan=False, description="clip the gradient norm to this (null: no clipping)")
    eval_every: int | None = Field(None, gt=0, description="evaluate every N steps (default steps // 10); always at the end")
    eval_batch_size: int = Field(128, gt=0, description="sequences per evaluation batch")
    log_every: int = Field(10, gt=0, description="record the training loss every N steps")
    precision: Literal["32", "bf16-mixed", "16-mixed"] = Field(
        "32", description="'32' anywhere; 'bf16-mixed' on GPUs with bfloat16 (Ampere+); '16-mixed' on GPUs"
    )
    accelerator: Literal["auto", "cpu", "gpu", "cuda", "mps", "tpu"] = Field(
        "auto", description="Lightning accelerator: auto (GPU when present), cpu, gpu, mps")
    devices: int | str = Field(1, description="devices per run (Lightning `devices`: N, -1 for all, 'auto', or '0,1')")
    strategy: str = Field("auto", description="Lightning strategy (auto, ddp, fsdp, deepspeed, ...)")
    num_nodes: int = Field(1, gt=0, description="nodes per run (Lightning `num_nodes`)")
    logger: Literal["csv", "tensorboard", "mlflow", "wandb"] = Field(
        "csv", description="Lightning logger of each run: csv, tensorboard (run folder's logs/), mlflow (MLFLOW_TRACKING_URI, "
        "default the run folder's mlflow.db) or wandb (offline in the run folder unless WANDB_MODE=online or WANDB_API_KEY)")
    checkpoint_every: int | None = Field(None, gt=0, description="checkpoint every N steps for resume (default: eval_every)")
    budget: Budget | None = Field(
        None, description="a budget in compute instead of steps: {flops: X}, {tokens: X} or {seconds: X} "
        "(exactly one); see workbench.cost.budget")
    attention_entropy: bool = Field(
        False, description="also record attention_entropy@<train_length> at every evaluation: the mean entropy of "
        "the attention rows over the keys each can see, divided by ln(that number): 1 uniform, 0 a saturated softmax")

    @field_validator("precision", mode="before")
    @classmethod
    def _precision_text(cls, v):
        return str(v) if isinstance(v, int) else v  # `precision: 32` in YAML is an int

    @field_validator("devices")
    @classmethod
    def _devices(cls, v):
        if isinstance(v, int) and (v >= 1 or v == -1):
            return v
        if isinstance(v, str) and (v == "auto" or re.fullmatch(r"\d+(,\d+)*,?", v.strip())):
            return v
        raise SpecError("train.devices", f"expected a device count >= 1, -1 (all), 'auto' or a list like '0,1'; got {v!r}")

    @field_validator("strategy")
    @classmethod
    def _strategy(cls, v):
        if v.split("_")[0] not in LIGHTNING_STRATEGIES:
            raise SpecError("train.strategy", f"unknown Lightning strategy {v!r}", LIGHTNING_STRATEGIES)
        return v

    @model_validator(mode="after")
    def _one_budget(self):
        if [self.steps, self.tokens, self.budget].count(None) != 2:
            raise SpecError("train.steps", "give exactly one training budget: steps, tokens or budget")
        if self.budget is not None and self.budget.kind == "seconds" and self.eval_every is None:
            raise SpecError("train.eval_every", "with budget.seconds the number of steps is not known in advance: "
                            "say how often to evaluate (train.eval_every: N steps)")
        return self

    @classmethod
    def defining(cls, train: Mapping[str, Any]) -> dict[str, Any]:
        """The fields of a training section that decide what a run computes (no execution
        fields, no opt-in measurement that is off)."""
        return {k: v for k, v in train.items() if k not in cls.EXECUTION and (v or k not in cls.OPT_IN)}

    def resolved(self, train_length: int, cost: StepCost | None = None) -> dict[str, Any]:
        """Every field filled in: steps from tokens (or, estimated, from a counted budget and the
        run's `cost` per step), eval and checkpoint intervals."""
        out = self.model_dump()
        if self.budget is None:
            steps = self.steps or -(-self.tokens // (self.batch_size * train_length))
        elif self.budget.kind == "seconds":
            steps = BUDGET_STEP_CAP  # the run stops on time (workbench.run.train)
        else:
            if cost is None:
                raise ValueError("a FLOP or token budget needs the run's cost per step")
            try:
                steps = estimated_steps(self.budget.amount, self.budget.kind, cost)
            except ValueError as err:
                raise SpecError(f"train.budget.{self.budget.kind}", str(err)) from None
        out["steps"] = steps
        out["eval_every"] = min(self.eval_every or max(1, steps // 10), steps)
        out["checkpoint_every"] = min(self.checkpoint_every or out["eval_every"], steps)
        out["log_every"] = min(self.log_every, steps)
        return out


class Target(BaseModel):
    """The score a `*_to_target` expectation waits for."""

    model_config = ConfigDict(extra="forbid")
    metric: str = Field(description="metric@eval_length the evaluations are read on (e.g. bpc@64)")
    value: float = Field(allow_inf_nan=False, description="the score to reach (at least it, or at most it when lower is better)")


class Expectation(BaseModel):
    """A claim the report checks: `better` is expected to beat `than` on `metric`."""

    model_config = ConfigDict(extra="forbid")
    metric: str = Field(description="metric[@eval_length] (e.g. accuracy@64, loss), a run measure (tokens_per_s), or "
                        "flops_to_target / tokens_to_target / seconds_to_target with a `target` (lower is better)")
    target: Target | None = Field(None, description="for *_to_target: {metric: metric@length, value: score}")
    better: Any = Field(description="the swept value (or {dotted.key: value}) expected to be better")
    than: Any = Field(description="the swept value (or {dotted.key: value}) it is compared against")
    claim: str | None = Field(None, description="id of the claim it tests (e.g. E6)")
    note: str = Field("", description="free text shown with the verdict")


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


class Sweep(BaseModel):
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


class Tune(BaseModel):
    """A study's `tune:` section: each sweep point picks its own values of `values`' keys (a
    grid over them), the best mean `metric` over `seeds` tuning runs per candidate, scored on
    validation sets; then its seeds run at that value (workbench.tuning)."""

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
