"""Study files: the YAML schema, loading with line numbers, profiles.

A study names a task, a model, a training budget and the seeds, and sweeps dotted keys:

    name: positions            task: {name: copy, train_length: 16}
    model: {d_model: 64, ...}  train: {steps: 500, batch_size: 32, lr: 1.0e-3}
    seeds: [0, 1]              sweep: {model.position: [none, rope, alibi]}

Loading is three steps, each reporting the first mistake as one line with file, line, field
path, problem and valid choices:

    YAML text --SafeLoader compose--> node tree (key -> line) + plain data
              --profile overrides--> data --pydantic (Study kind)--> validated study
    `workbench.sweep.expand` then validates every run's model spec.

The `kind` field selects the study class through the study-kind registry (workbench.kinds);
a new kind is a StudyBase subclass with its own section plus a StudyKind that runs and reports it.
"""

from __future__ import annotations

import copy
import hashlib
import itertools
import json
import math
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, WithJsonSchema, field_validator
from pydantic import model_validator

from workbench import kinds
from workbench.errors import SpecError, WorkbenchError, closest
from workbench.registry import get_variant, variants
from workbench.spec import ModelSpec, resolve_choice, spec_error_from

VARIANT_AXES = ("position", "attention", "norm", "ffn")
SWEEPABLE_SECTIONS = ("task", "model", "train")
# Columns every run records (besides metrics), usable in `expect` records.
RUN_MEASURES = ("tokens_per_s", "peak_memory_bytes", "n_params", "wall_time_s", "train_time_s")


class StudyError(WorkbenchError):
    """A mistake in a study file, located as `file:line: field: problem (valid: ...)`."""

    def __init__(self, file: str, line: int | None, error: SpecError | str):
        self.file, self.line = file, line
        self.field = error.field if isinstance(error, SpecError) else ""
        where = f"{file}:{line}" if line else file
        if line == 0:  # a field the command line set (--set)
            where = f"{file} with --set"
        super().__init__(f"{where}: {error}")


# ---- YAML with line numbers -----------------------------------------------------------------


class LineMap:
    """Dotted field path -> 1-based line of the YAML key (or list item) that holds it."""

    def __init__(self) -> None:
        self.lines: dict[str, int] = {}

    @classmethod
    def of(cls, node: yaml.Node | None, file: str) -> LineMap:
        out = cls()
        if node is not None:
            out._walk(node, "", file)
        return out

    def _walk(self, node: yaml.Node, prefix: str, file: str) -> None:
        if isinstance(node, yaml.MappingNode):
            seen: set[str] = set()
            for key_node, value_node in node.value:
                key = str(key_node.value)
                path = f"{prefix}.{key}" if prefix else key
                if key in seen:  # SafeLoader would silently keep the last one
                    raise StudyError(file, key_node.start_mark.line + 1, SpecError(path, "duplicate key"))
                seen.add(key)
                self.lines[path] = key_node.start_mark.line + 1
                self._walk(value_node, path, file)
        elif isinstance(node, yaml.SequenceNode):
            for i, item in enumerate(node.value):
                path = f"{prefix}.{i}"
                self.lines[path] = item.start_mark.line + 1
                self._walk(item, path, file)

    def line(self, field: str) -> int | None:
        """Line of `field`, or of its closest enclosing field that the file spells out."""
        parts = field.split(".")
        while parts:
            found = self.lines.get(".".join(parts))
            if found is not None:
                return found
            parts.pop()
        return None


def read_yaml(path: Path) -> tuple[str, Any, LineMap]:
    """Text, plain data and line map of a YAML file; safe loading only (no Python objects)."""
    file = str(path)
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise WorkbenchError(f"{file}: study file not found") from None
    except OSError as err:
        raise WorkbenchError(f"{file}: cannot read the study file ({err.strerror})") from None
    except UnicodeDecodeError:
        raise WorkbenchError(f"{file}: not a text (UTF-8) file; a study is a YAML file") from None
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        size = expanded_size(node)
        if size > limit("WORKBENCH_MAX_YAML_NODES"):
            raise StudyError(file, None, f"its YAML aliases (*name) expand to {size:.3g} nodes, over the limit of "
                             f"{limit('WORKBENCH_MAX_YAML_NODES')}: write the values out, or set "
                             "WORKBENCH_MAX_YAML_NODES to allow it")
        data = loader.construct_document(node) if node is not None else None
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None) or getattr(err, "context_mark", None)
        problem = getattr(err, "problem", None) or str(err)
        context = getattr(err, "context", None)
        message = f"malformed YAML: {problem}" + (f" ({context})" if context else "")
        raise StudyError(file, mark.line + 1 if mark else None, message) from None
    finally:
        loader.dispose()
    return text, data, LineMap.of(node, file)


def expanded_size(node: yaml.Node | None, memo: dict[int, int] | None = None) -> int:
    """Nodes of the document once every alias is expanded, computed without expanding them
    (a 400-byte "billion laughs" file expands to 10^9 nodes)."""
    if node is None:
        return 0
    memo = {} if memo is None else memo
    key = id(node)
    if key in memo:
        return memo[key]
    memo[key] = 1  # a recursive alias counts once more, instead of forever
    if isinstance(node, yaml.MappingNode):
        size = 1 + sum(expanded_size(k, memo) + expanded_size(v, memo) for k, v in node.value)
    elif isinstance(node, yaml.SequenceNode):
        size = 1 + sum(expanded_size(item, memo) for item in node.value)
    else:
        size = 1
    memo[key] = size
    return size


# ---- size limits ----------------------------------------------------------------------------

LIMITS = {  # environment variable -> default; the defaults refuse only the absurd
    "WORKBENCH_MAX_RUNS": 10_000,  # runs of one study (sweep points x seeds)
    "WORKBENCH_MAX_PARAMS": 20_000_000_000,  # estimated parameters of one model
    "WORKBENCH_MAX_ACTIVATION_BYTES": 2**40,  # estimated activation memory of one batch (1 TiB)
    "WORKBENCH_MAX_YAML_NODES": 100_000,  # nodes of a study file once its aliases are expanded
}


def limit(name: str) -> int:
    value = os.environ.get(name)
    if value is None:
        return LIMITS[name]
    try:
        return int(float(value))
    except ValueError:
        raise SpecError(name, f"expected a number, got {value!r}") from None


# ---- dotted keys ----------------------------------------------------------------------------


def get_dotted(data: Mapping[str, Any], key: str) -> Any:
    node: Any = data
    for part in key.split("."):
        node = node[part]
    return node


def set_dotted(data: dict[str, Any], key: str, value: Any) -> None:
    """data[a][b][c] = value for key "a.b.c"; a variant given by name becomes {name: ...} when a
    parameter below it is set (model.attention.window on `attention: sliding_window`)."""
    *parents, last = key.split(".")
    node = data
    for part in parents:
        child = node.get(part)
        if isinstance(child, str):
            child = {"name": child}
        elif not isinstance(child, dict):
            child = {}
        node[part] = child
        node = child
    node[last] = copy.deepcopy(value)


def label(value: Any) -> Any:
    """A swept value as one flat column entry: scalars as they are, a variant mapping as
    `name(param=value, ...)`, anything else as compact JSON."""
    if isinstance(value, Mapping) and "name" in value:
        params = ", ".join(f"{k}={v}" for k, v in value.items() if k != "name")
        return f"{value['name']}({params})" if params else str(value["name"])
    if isinstance(value, (Mapping, list)):
        return json.dumps(value, sort_keys=True)
    return value


def canonical_json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), default=str)


def digest(value: Any, n: int = 12) -> str:
    return hashlib.sha256(canonical_json(value).encode()).hexdigest()[:n]


# ---- sections -------------------------------------------------------------------------------


# Lightning's registered strategy names, by their first word (ddp_spawn, deepspeed_stage_2, ...);
# tests/test_reliability.py checks them against Lightning's StrategyRegistry.
LIGHTNING_STRATEGIES = ("auto", "ddp", "deepspeed", "fsdp", "single", "xla")


class TrainConfig(BaseModel):
    """How each run trains. Execution fields (where and how it runs) do not change a run's id."""

    model_config = ConfigDict(extra="forbid")
    EXECUTION: ClassVar[tuple[str, ...]] = (
        "accelerator", "devices", "strategy", "num_nodes", "logger", "checkpoint_every", "eval_batch_size",
    )

    steps: int | None = Field(None, gt=0, description="optimizer steps per run (give steps or tokens)")
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
        if (self.steps is None) == (self.tokens is None):
            raise SpecError("train.steps", "give exactly one training budget: steps or tokens")
        return self

    def resolved(self, train_length: int) -> dict[str, Any]:
        """Every field filled in: steps from tokens, eval and checkpoint intervals."""
        out = self.model_dump()
        steps = self.steps or -(-self.tokens // (self.batch_size * train_length))
        out["steps"] = steps
        out["eval_every"] = min(self.eval_every or max(1, steps // 10), steps)
        out["checkpoint_every"] = min(self.checkpoint_every or out["eval_every"], steps)
        out["log_every"] = min(self.log_every, steps)
        return out


class Expectation(BaseModel):
    """A claim the report checks: `better` is expected to beat `than` on `metric`."""

    model_config = ConfigDict(extra="forbid")
    metric: str = Field(description="metric[@eval_length] (e.g. accuracy@64, loss) or a run measure (tokens_per_s)")
    better: Any = Field(description="the swept value (or {dotted.key: value}) expected to be better")
    than: Any = Field(description="the swept value (or {dotted.key: value}) it is compared against")
    claim: str | None = Field(None, description="id of the claim it tests (e.g. E6)")
    note: str = Field("", description="free text shown with the verdict")


SWEEP_JSON_SCHEMA = {
    "type": "object",
    "description": "dotted.key: [values] (a grid over every key); `zip: [{key: [...], key2: [...]}]` for keys "
    "that vary together (lists of equal length)",
    "properties": {
        "zip": {
            "type": "array",
            "items": {"type": "object", "additionalProperties": {"type": "array", "minItems": 1}},
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


def task_section(value: Any) -> dict[str, Any]:
    """{name, **params} validated through the task registry; returns the resolved mapping."""
    if not isinstance(value, Mapping):
        raise SpecError("task", f"expected a mapping {{name: <task>, <params>}}, got {value!r}")
    raw = dict(value)
    if "name" not in raw:
        raise SpecError("task.name", "missing: the task section needs a name", sorted(variants("task")))
    name = raw.pop("name")
    cls = get_variant("task", str(name), "task.name")
    try:
        params = cls.Params.model_validate(raw)
    except ValidationError as err:
        raise unwrap(err, "task") from None
    return {"name": str(name), **params.model_dump()}


def unwrap(err: ValidationError, prefix: str = "") -> SpecError:
    """A pydantic report as one SpecError: a SpecError raised inside a validator keeps its own
    field; otherwise the first error's location becomes the field path."""
    first = err.errors()[0]
    inner = (first.get("ctx") or {}).get("error")
    if isinstance(inner, SpecError):
        return inner
    if first["type"] == "extra_forbidden":
        path = ".".join(str(p) for p in (prefix, *first["loc"]) if p != "")
        parent = ".".join(path.split(".")[:-1])
        return SpecError(path, "unknown key" + suggest(path.split(".")[-1], known_keys(parent)), known_keys(parent))
    return spec_error_from(err, prefix)


def suggest(name: str, choices: list[str] | None) -> str:
    hint = closest(name, choices or [])
    return f"; did you mean {hint!r}?" if hint else ""


def known_keys(section: str) -> list[str] | None:
    """Field names valid inside a dotted section of a train study (for 'unknown key' hints)."""
    tops = {
        "": list(TrainStudy.model_fields),
        "train": list(TrainConfig.model_fields),
        "model": list(ModelSpec.model_fields),
        "sweep": None,
    }
    if section in tops:
        return tops[section]
    if re.fullmatch(r"expect\.\d+", section):
        return list(Expectation.model_fields)
    return None


# ---- studies --------------------------------------------------------------------------------


class StudyBase(BaseModel):
    """Fields every kind of study has."""

    model_config = ConfigDict(extra="forbid")
    kind: str
    name: str = Field(
        pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$",
        description="study name: letters, digits, '-', '_', '.'; the default output folder is runs/<name>/",
    )
    description: str = Field("", description="one line: the question the study answers")
    notes: str = Field("", description="free text shown in reports")
    seeds: list[Annotated[int, Field(ge=0, le=2**32 - 1)]] = Field(
        [0], min_length=1, description="every sweep point trains once per seed (0 .. 2^32-1)")
    profiles: dict[str, dict[str, Any]] = Field(
        {}, description="named overrides {profile: {dotted.key: value}}, applied by `workbench run --profile NAME`"
    )

    @field_validator("model", mode="before", check_fields=False)  # each kind declares its model field
    @classmethod
    def _model(cls, v):
        if v is None:
            return {}
        if not isinstance(v, Mapping):
            raise SpecError("model", f"expected a mapping of model fields, got {v!r}")
        return dict(v)

    def run_defining(self) -> dict[str, Any]:
        """The part of the study that determines which runs exist and what they compute: a
        change here, against an existing output folder, is a different study."""
        raise NotImplementedError


class TrainStudy(StudyBase):
    """Train every sweep point on a task and compare the final metrics."""

    kind: Literal["train"] = Field("train", description="train: a sweep of trained models")
    task: Annotated[
        dict[str, Any], WithJsonSchema({"x-section": "TaskSection"})
    ] = Field(description="{name: <task>, <task params>}; see `workbench list task`")
    model: Annotated[dict[str, Any], WithJsonSchema({"x-section": "ModelSection"})] = Field(
        default_factory=dict, description="the model spec (see the README); the task sets vocab_size"
    )
    train: TrainConfig
    sweep: Annotated[Sweep, WithJsonSchema(SWEEP_JSON_SCHEMA)] = Field(default_factory=Sweep)
    baseline: Any = Field(
        None, description="the swept value (or {dotted.key: value}) the others are compared against"
    )
    expect: list[Expectation] = Field([], description="claims the report checks")
    tune: Annotated[Tune | None, WithJsonSchema(TUNE_JSON_SCHEMA)] = Field(
        None, description="choose values (e.g. train.lr) per sweep point on validation sets before its seeds run"
    )

    @field_validator("task", mode="before")
    @classmethod
    def _task(cls, v, info: ValidationInfo):
        if stored(info):
            return dict(v)
        return task_section(v)

    @model_validator(mode="after")
    def _cross_checks(self, info: ValidationInfo):
        for key in [] if stored(info) else self.sweep.keys:
            check_key(key, self.sweep.field(key), self.task)
            check_swept_variants(key, self.sweep.field(key), self.sweep.values(key), self.model, self.sweep.keys)
        if self.baseline is not None:
            self.baseline = self.sweep_point(self.baseline, "baseline")
        for i, exp in enumerate(self.expect):
            if not stored(info):
                check_metric(exp.metric, f"expect.{i}.metric", self)
            exp.better = self.sweep_point(exp.better, f"expect.{i}.better")
            exp.than = self.sweep_point(exp.than, f"expect.{i}.than")
        for profile, overrides in self.profiles.items():
            for key in overrides:
                if key != "seeds" and not stored(info):
                    check_key(key, f"profiles.{profile}.{key}", self.task)
        if self.tune is not None:
            self.tune = check_tune(self.tune, self)
        return self

    def sweep_point(self, value: Any, field: str) -> dict[str, Any]:
        """A swept value (when one key is swept) or {dotted.key: value} -> {key: value}, each
        value checked against the key's swept values (a variant by name equals {name: ...})."""
        keys = self.sweep.keys
        if not keys:
            raise SpecError(field, "the study sweeps nothing, so there is nothing to compare")
        if isinstance(value, Mapping) and value and all(k in keys for k in value):
            point = dict(value)
        elif len(keys) == 1:
            point = {keys[0]: value}
        else:
            raise SpecError(field, "several keys are swept: give {dotted.key: value}", keys)
        for key, v in point.items():
            options = [label(x) for x in self.sweep.values(key)]
            if label(v) not in options:
                raise SpecError(f"{field}.{key}" if len(point) > 1 or isinstance(value, Mapping) else field,
                                f"{label(v)!r} is not a swept value of {key}", [str(o) for o in options])
        return point

    def run_defining(self) -> dict[str, Any]:
        train = {k: v for k, v in self.train.model_dump().items() if k not in TrainConfig.EXECUTION}
        out = {"kind": self.kind, "task": self.task, "model": self.model, "train": train,
               "seeds": self.seeds, "sweep": self.sweep.model_dump()}
        if self.tune is not None:  # absent otherwise: an untuned study keeps the hash it always had
            out["tune"] = self.tune.model_dump()
        return out


STORED = "stored"  # validation context: a study read back from a results store


def stored(info: ValidationInfo) -> bool:
    """A study read back from a store was checked against the registry when it ran; reading
    it again (for a report) must not need the plugins it used to still be installed."""
    return bool(info.context and info.context.get(STORED))


def check_key(key: str, field: str, task: dict[str, Any]) -> None:
    """A dotted key that a sweep or profile sets must name an existing field."""
    section, _, rest = key.partition(".")
    if section not in SWEEPABLE_SECTIONS or not rest:
        valid = [f"{s}.<field>" for s in SWEEPABLE_SECTIONS]
        raise SpecError(field, f"{key!r} is not a dotted key of a study field", valid)
    head, _, deeper = rest.partition(".")
    if section == "model":
        fields = list(ModelSpec.model_fields)
        if deeper and head not in VARIANT_AXES:
            raise SpecError(field, f"model.{head} has no sub-keys (only variant axes do: {', '.join(VARIANT_AXES)})")
    elif section == "train":
        fields = list(TrainConfig.model_fields)
    else:
        fields = ["name", *get_variant("task", task["name"]).Params.model_fields]
    if head not in fields:
        choices = [f"{section}.{f}" for f in fields]
        raise SpecError(field, f"no such key {key!r}" + suggest(f"{section}.{head}", choices), choices)
    if section != "model" and deeper:
        raise SpecError(field, f"{section}.{head} has no sub-keys")


def check_tune(tune: Tune, study: TrainStudy) -> Tune:
    """Tuned keys name training or model fields that are not swept; the metric is one the task
    records, at an evaluation length (a bare name means at train_length); the tuning seeds
    are among the study's. Returns the section with the metric spelled `name@length`."""
    for key in tune.keys:
        field = f"tune.{key}"
        check_key(key, field, study.task)
        section, _, name = key.partition(".")
        if section == "task":
            raise SpecError(field, "tuning chooses how a model learns (train.* or model.*), not the task")
        if section == "train" and name in TrainConfig.EXECUTION:
            raise SpecError(field, f"{key} says where a run executes, not what it computes: nothing to tune")
        if key in study.sweep.keys:
            raise SpecError(field, f"{key} is also swept: a key is either compared (sweep) or chosen per point (tune)")
    name, _, length = tune.metric.partition("@")
    lengths = study.task.get("eval_lengths") or [study.task["train_length"]]
    choices = [*get_variant("task", study.task["name"]).metrics, "loss"]
    if name not in choices:
        why = " (run measures such as tokens_per_s are not chosen on validation data)" if name in RUN_MEASURES else ""
        raise SpecError("tune.metric", f"unknown metric {name!r}{why}" + suggest(name, choices),
                        [f"{c}@{lengths[0]}" for c in choices])
    if not length:
        length = str(study.task["train_length"])
    if "task.eval_lengths" not in study.sweep.keys and (not length.isdigit() or int(length) not in lengths):
        raise SpecError("tune.metric", f"{tune.metric!r}: no evaluation at length {length}",
                        [f"{name}@{n}" for n in lengths])
    if tune.seeds > len(study.seeds):
        raise SpecError("tune.seeds", f"{tune.seeds} tuning seeds, but the study has {len(study.seeds)} "
                        f"(tuning runs use the study's first N seeds: {study.seeds})")
    return tune.model_copy(update={"metric": f"{name}@{length}"})


def check_swept_variants(key: str, field: str, values: list[Any], model: Mapping[str, Any],
                         swept: list[str]) -> None:
    """Swept variants are checked where they are written: a typo in `model.ffn: [gelu, swigl]`
    is blamed on the sweep line (not on a baseline or `expect:` that spells the name right),
    and a swept variant parameter must belong to the variant the model section selects."""
    parts = key.split(".")
    if parts[0] != "model" or len(parts) < 2 or parts[1] not in VARIANT_AXES:
        return
    axis = parts[1]
    if len(parts) == 2:
        for value in values:
            try:
                resolve_choice(axis, value, field)
            except SpecError as err:
                raise SpecError(field, f"{err.problem} (in the sweep value {key}={label(value)})", err.choices) from None
        return
    if f"model.{axis}" in swept:
        return  # each swept variant gets the parameter: checked per run by the expansion
    given = model.get(axis, ModelSpec.model_fields[axis].default)
    name = given.get("name") if isinstance(given, Mapping) else given
    if not isinstance(name, str) or name not in variants(axis):
        return  # the model section's own error is reported when it is validated
    params = list(variants(axis)[name].Params.model_fields)
    if parts[2] not in params:
        having = sorted(n for n, cls in variants(axis).items() if parts[2] in cls.Params.model_fields)
        where = f"model.{axis} is {name!r}" + ("" if axis in model else " (the default)")
        hint = f"; set model.{axis}: {{name: {having[0]}}} or sweep model.{axis}" if having else ""
        raise SpecError(field, f"{where}, which has no parameter {parts[2]!r}{hint}",
                        [f"model.{axis}.{p}" for p in params] or None)


def check_metric(metric: str, field: str, study: TrainStudy) -> None:
    task_cls = get_variant("task", study.task["name"])
    names = [*task_cls.metrics, "loss"]
    name, _, length = metric.partition("@")
    if metric in RUN_MEASURES:
        return
    if name not in names:
        choices = [*names, *RUN_MEASURES]
        raise SpecError(field, f"unknown metric {name!r}" + suggest(name, choices), choices)
    lengths = study.task.get("eval_lengths") or [study.task["train_length"]]
    if length and "task.eval_lengths" not in study.sweep.keys and (not length.isdigit() or int(length) not in lengths):
        raise SpecError(field, f"{metric!r}: no evaluation at length {length}", [f"{name}@{n}" for n in lengths])


def study_kinds() -> dict[str, type[StudyBase]]:
    """The study class of every registered study kind (workbench.kinds), by name."""
    return {name: kind.study for name, kind in kinds.study_kinds().items()}


# ---- loading --------------------------------------------------------------------------------


@dataclass
class StudyFile:
    """A loaded study with where it came from, so later checks can point into the file."""

    path: Path
    text: str
    data: dict[str, Any]  # the YAML data after profile overrides
    lines: LineMap
    study: StudyBase
    profile: str | None = None
    overrides: tuple[str, ...] = ()  # `--set key=value` texts, in the order given

    def error(self, err: SpecError, context: str = "") -> StudyError:
        if context:
            err = SpecError(err.field, f"{err.problem} ({context})", err.choices)
        return StudyError(str(self.path), self.lines.line(err.field), err)

    @property
    def study_hash(self) -> str:
        return digest(self.study.run_defining())


def apply_profile(data: dict[str, Any], profile: str, file: str, lines: LineMap) -> dict[str, Any]:
    profiles = data.get("profiles") or {}
    if not isinstance(profiles, Mapping) or profile not in profiles:
        names = sorted(profiles) if isinstance(profiles, Mapping) else []
        raise StudyError(file, lines.line("profiles"),
                         SpecError("--profile", f"unknown profile {profile!r}" + suggest(profile, names), names))
    overrides = profiles[profile]
    if not isinstance(overrides, Mapping):
        raise StudyError(file, lines.line(f"profiles.{profile}"),
                         SpecError(f"profiles.{profile}", "expected a mapping {dotted.key: value}"))
    data = copy.deepcopy(data)
    for key, value in overrides.items():
        set_dotted(data, str(key), value)
        # An error in an overridden field points at the profile line that set it.
        lines.lines[str(key)] = lines.line(f"profiles.{profile}.{key}") or 0
    return data


def parse_override(text: str) -> tuple[str, Any]:
    """`train.steps=500` -> ("train.steps", 500): the value is read as YAML (safe), so lists,
    mappings and numbers are written as in a study file."""
    key, sep, value = text.partition("=")
    key = key.strip()
    if not sep or not key:
        raise SpecError("--set", f"expected KEY=VALUE (e.g. train.steps=500), got {text!r}")
    try:
        return key, yaml.safe_load(value) if value.strip() else None
    except yaml.YAMLError as err:
        raise SpecError(f"--set {key}", f"the value {value!r} is not valid YAML ({getattr(err, 'problem', err)})") from None


def apply_overrides(data: dict[str, Any], overrides: tuple[str, ...], file: str, lines: LineMap) -> dict[str, Any]:
    """`--set` on the command line: each KEY=VALUE edits the study as if the file said so
    (a dotted key of task, model or train; `seeds`; or `sweep.<dotted key>` for a swept list),
    so it changes the study hash exactly like the same edit of the file would."""
    data = copy.deepcopy(data)
    for text in overrides:
        try:
            key, value = parse_override(text)
        except SpecError as err:
            raise StudyError(file, None, err) from None
        if key.startswith("sweep."):
            sweep = data.get("sweep")
            data["sweep"] = {**(sweep if isinstance(sweep, Mapping) else {}), key.removeprefix("sweep."): value}
        elif "." in key:
            set_dotted(data, key, value)
        else:
            data[key] = value
        lines.lines[key] = 0  # an error in an overridden field names the field, not a line of the file
    return data


def load_study(path: str | Path, profile: str | None = None, overrides: tuple[str, ...] | list[str] = ()) -> StudyFile:
    """Read and validate a study file, with a profile's and then the command line's overrides
    applied. Raises StudyError (a WorkbenchError) with file and line."""
    path = Path(path)
    file = str(path)
    text, data, lines = read_yaml(path)
    if not isinstance(data, Mapping):
        raise StudyError(file, 1, SpecError("", f"a study file is a mapping of fields (name, task, ...), got {type(data).__name__}"))
    data = dict(data)
    if profile is not None:
        data = apply_profile(data, profile, file, lines)
    overrides = tuple(overrides)
    if overrides:
        data = apply_overrides(data, overrides, file, lines)
    kind = data.get("kind", "train")
    if kind not in study_kinds():
        raise StudyError(file, lines.line("kind"),
                         SpecError("kind", f"unknown study kind {kind!r}" + suggest(str(kind), list(study_kinds())),
                                   study_kinds()))
    cls = study_kinds()[kind]
    try:
        study = cls.model_validate(data)
    except ValidationError as err:
        spec_err = unwrap(err)
        raise StudyError(file, lines.line(spec_err.field), spec_err) from None
    except SpecError as err:
        raise StudyError(file, lines.line(err.field), err) from None
    return StudyFile(path=path, text=text, data=data, lines=lines, study=study, profile=profile, overrides=overrides)


# ---- JSON Schema ----------------------------------------------------------------------------


def variant_json_schema(axis: str) -> dict[str, Any]:
    """A variant field: a registered name, or {name: <registered>, <its params>}."""
    options: list[dict[str, Any]] = [{"type": "string", "enum": sorted(variants(axis))}]
    for name, cls in variants(axis).items():
        params = cls.Params.model_json_schema()
        options.append({
            "type": "object",
            "properties": {"name": {"const": name}, **params.get("properties", {})},
            "required": ["name"],
            "additionalProperties": False,
        })
    return {"anyOf": options}


def study_json_schema() -> dict[str, Any]:
    """JSON Schema of a study file (every kind), with registered variants and tasks spelled
    out so editors can complete names and parameters."""
    # One schema per kind, joined by anyOf: pydantic cannot generate a Union of models whose
    # fields $ref definitions (ModelSection, TaskSection) that are only added below.
    per_kind = [cls.model_json_schema() for cls in study_kinds().values()]
    defs = {name: d for s in per_kind for name, d in s.pop("$defs", {}).items()}
    schema = per_kind[0] if len(per_kind) == 1 else {"anyOf": per_kind}
    schema["$defs"] = defs
    model = ModelSpec.model_json_schema()
    for axis in VARIANT_AXES:
        model["properties"][axis] = {**variant_json_schema(axis), "description": model["properties"][axis].get("description", "")}
    defs["ModelSection"] = model
    tasks = variant_json_schema("task")
    defs["TaskSection"] = {"anyOf": tasks["anyOf"][1:], "description": "{name: <task>, <task params>}"}
    schema = link_sections(schema)
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = "Transformer Workbench study"
    return schema


def link_sections(node: Any) -> Any:
    """Fields typed `{"x-section": NAME}` (a placeholder pydantic accepts) -> a $ref to the
    registry-derived definition NAME."""
    if isinstance(node, dict):
        if "x-section" in node:
            extra = {k: v for k, v in node.items() if k != "x-section"}
            return {"$ref": f"#/$defs/{node['x-section']}", **extra}
        return {k: link_sections(v) for k, v in node.items()}
    if isinstance(node, list):
        return [link_sections(v) for v in node]
    return node
