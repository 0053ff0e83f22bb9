"""The `train` kind's study class: a sweep of trained models, with its cross-field checks
(swept keys and variants, `expect:` metrics, `tune:`, the scale ladder, early stopping).

Loading a study file (workbench.study.load_study) selects this class through the study-kind
registry; `workbench.recipes.train.sweep.expand` then validates every run's model spec.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, Literal

from pydantic import Field, ValidationError, ValidationInfo, WithJsonSchema, field_validator, model_validator
from pydantic.json_schema import SkipJsonSchema

from workbench.errors import SpecError
from workbench.model.spec import VARIANT_AXES, ModelSpec, resolve_axis
from workbench.registry import get_variant, variants
from workbench.results import DESCRIPTIVE_METRICS, FAILURE_SHARE, RUN_MEASURES, TO_TARGET
from workbench.study import StudyBase, check_key, stored, task_section, unwrap
from workbench.study.keys import label, value_variant
from workbench.study.sections import (SEEDS_JSON_SCHEMA, SWEEP_JSON_SCHEMA, TUNE_JSON_SCHEMA, Expectation, SeedPlan,
                                      Sweep, Tune, check_values)
from workbench.study.train_section import TrainConfig
from workbench.study.yaml_file import suggest

MAX_SEED = 2**32 - 1  # what numpy and the tasks' generators take
SCALE_JSON_SCHEMA = {"anyOf": [{"type": "object", "additionalProperties": {"type": "array", "minItems": 2}}, {"type": "null"}]}


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
    seeds: Annotated[list[Annotated[int, Field(ge=0, le=MAX_SEED)]], WithJsonSchema(SEEDS_JSON_SCHEMA)] = Field(
        [0], min_length=1, description="every sweep point trains once per seed (0 .. 2^32-1), or {first, max}")
    seed_plan: SkipJsonSchema[SeedPlan | None] = Field(
        None, description="set by `seeds: {first, max}` (adaptive seeds); `seeds` then holds the first ones")

    @model_validator(mode="before")
    @classmethod
    def _adaptive_seeds(cls, data: Any) -> Any:
        """`seeds: {first: 3, max: 20}` -> seeds [0, 1, 2] and the plan to add more."""
        if isinstance(data, Mapping) and isinstance(data.get("seeds"), Mapping):
            if "seed_plan" in data:
                raise SpecError("seed_plan", "set it through `seeds: {first: N, max: M}`")
            try:
                plan = SeedPlan.model_validate(data["seeds"])
            except ValidationError as err:
                raise unwrap(err, "seeds") from None
            return {**data, "seeds": plan.first_seeds, "seed_plan": plan}
        return data

    @property
    def every_seed(self) -> list[int]:
        """Every seed a final run may have: the listed ones, or an adaptive plan's up to max."""
        return self.seed_plan.seeds if self.seed_plan is not None else list(self.seeds)

    @property
    def tuning_seeds(self) -> list[int]:
        """Seeds of the tuning runs: the first `tune.seeds` integers above every final seed, so
        no reported seed was also the one a value was chosen on (no selection bias)."""
        start = max(self.every_seed) + 1
        return list(range(start, start + (self.tune.seeds if self.tune is not None else 0)))
    scale: Annotated[dict[str, list[Any]] | None, WithJsonSchema(SCALE_JSON_SCHEMA)] = Field(
        None, description="a scale ladder {size key: [rung values], key: [matching value per rung], ...} (e.g. "
        "model.d_model with train.budget.flops): every sweep point runs at every rung, every expect: entry is decided "
        "at each rung, and the report says whether it holds across them")
    curves_against: Literal["step", "tokens", "flops", "seconds"] = Field(
        "step", description="the x-axis of the report's learning curves: training step, training tokens, counted "
        "training FLOPs or training seconds")

    @field_validator("task", mode="before")
    @classmethod
    def _task(cls, v, info: ValidationInfo):
        if stored(info):
            return dict(v)
        return task_section(v)

    @model_validator(mode="after")
    def _cross_checks(self, info: ValidationInfo):
        # A study read back from a store holds its ladder in the sweep already.
        laddered = self.scale is not None and stored(info) and all(k in self.sweep.keys for k in self.scale)
        if self.scale is not None and not laddered:
            check_ladder(self)
        for key in [] if stored(info) else self.sweep.keys:
            check_key(key, self.sweep.field(key), self.task)
            check_swept_variants(key, self.sweep.field(key), self.sweep.values(key), self.model, self.sweep.keys)
        if self.baseline is not None:
            self.baseline = self.sweep_point(self.baseline, "baseline")
        for i, exp in enumerate(self.expect):
            if not stored(info):
                check_expected_metric(exp, f"expect.{i}", self)
            exp.better = self.sweep_point(exp.better, f"expect.{i}.better")
            exp.than = self.sweep_point(exp.than, f"expect.{i}.than")
        for profile, overrides in self.profiles.items():
            for key, value in overrides.items():
                # `sweep.<key>` (`scale.<key>`) replaces a swept (rung) list, `sweep.zip` the zipped
                # groups (their keys are checked); `tune.<key>` is checked with tune:
                if key == "seeds" or key.startswith("tune.") or stored(info):
                    continue
                field = f"profiles.{profile}.{key}"
                if key == "sweep.zip":
                    groups = value if isinstance(value, list) else [value]
                    if not all(isinstance(g, dict) for g in groups):
                        raise SpecError(field, "expected {dotted.key: [values], ...} (or a list of them), as sweep.zip")
                    for zipped in (k for g in groups for k in g):
                        check_key(zipped, f"{field}.{zipped}", self.task)
                else:
                    check_key(key.removeprefix("sweep.").removeprefix("scale."), field, self.task)
        if self.tune is not None:
            self.tune = check_tune(self.tune, self)
        stop = self.train.early_stopping
        if stop is not None and not stored(info):
            if stop.metric in RUN_MEASURES or "@" not in stop.metric:
                lengths = self.task.get("eval_lengths") or [self.task["train_length"]]
                raise SpecError("train.early_stopping.metric", f"{stop.metric!r} is not evaluated during training: "
                                f"give metric@length, e.g. loss@{lengths[0]}")
            check_metric(stop.metric, "train.early_stopping.metric", self)
        if self.scale is not None and not laddered:
            self.sweep = ladder_sweep(self)
        return self

    @property
    def rung_key(self) -> str | None:
        """The size key of a scale ladder (its first key), whose values name the rungs."""
        return next(iter(self.scale)) if self.scale else None

    def sweep_point(self, value: Any, field: str) -> dict[str, Any]:
        """A swept value (when one key is swept) or {dotted.key: value} -> {key: value}, each
        value checked against the key's swept values (a variant by name equals {name: ...}; a
        parameterised one may be named by its name where one swept value has it). A
        ladder's keys are rungs, not compared: a bare value names the one other swept key. Keys
        zipped with a named one are filled in where the named values pick one row of the zip (a
        scheme zipped with its learning rate names its rate too)."""
        keys = self.sweep.keys
        compared = [k for k in keys if k not in (self.scale or {})]
        if not keys:
            raise SpecError(field, "the study sweeps nothing, so there is nothing to compare")
        if isinstance(value, Mapping) and value and all(k in keys for k in value):
            point = dict(value)
        elif len(compared) == 1:
            point = {compared[0]: value}
        else:
            raise SpecError(field, "several keys are swept: give {dotted.key: value}", compared)
        for key, v in point.items():
            swept = self.sweep.values(key)
            options = [label(x) for x in swept]
            if label(v) in options:
                continue
            where = f"{field}.{key}" if len(point) > 1 or isinstance(value, Mapping) else field
            named = [x for x in swept if isinstance(v, str) and value_variant(x) == v]  # `layerscale` alone
            if len(named) > 1:
                raise SpecError(where, f"{v!r} names {len(named)} swept values of {key}: give one of them in full",
                                [str(label(x)) for x in named])
            if not named:
                raise SpecError(where, f"{label(v)!r} is not a swept value of {key}", [str(o) for o in options])
            point[key] = named[0]
        for group in self.sweep.zip:  # zipped keys vary together: naming some of them names the rest
            given = [k for k in group if k in point]
            rows = [i for i in range(len(group[given[0]]))
                    if all(label(group[k][i]) == label(point[k]) for k in given)] if given else []
            if len(rows) == 1:
                point.update({k: values[rows[0]] for k, values in group.items() if k not in point})
        return point

    def run_defining(self) -> dict[str, Any]:
        train = TrainConfig.defining(self.train.model_dump())
        # exclude_defaults: a plan from seed 0 keeps the hash it had before `start` existed
        seeds = self.seed_plan.model_dump(exclude_defaults=True) if self.seed_plan is not None else self.seeds
        task = get_variant("task", self.task["name"]).defining(self.task)
        out = {"kind": self.kind, "task": task, "model": self.model, "train": train,
               "seeds": seeds, "sweep": self.sweep.model_dump()}
        if self.tune is not None:  # absent otherwise: an untuned study keeps the hash it always had
            out["tune"] = self.tune.model_dump()
        if self.scale is not None:  # the same: absent without a ladder
            out["scale"] = self.scale
        return out


def ladder_sweep(study: TrainStudy) -> Sweep:
    """The study's sweep with its scale ladder as one more zip group (every sweep point at every
    rung), made after `expect:` and `baseline` were read against the sweep alone, so that an
    entry such as `better: swiglu` is decided at each rung."""
    return Sweep(grid=study.sweep.grid, zip=[*study.sweep.zip, dict(study.scale)])


def check_ladder(study: TrainStudy) -> None:
    """A ladder gives one value per rung for each key, at least two rungs, of keys that are
    neither swept nor tuned."""
    rungs = {key: check_values(f"scale.{key}", values) for key, values in study.scale.items()}
    if len(set(rungs.values())) > 1:
        sizes = ", ".join(f"{k}: {n}" for k, n in rungs.items())
        raise SpecError("scale", f"every key of a ladder gives one value per rung: equal lengths ({sizes})")
    if next(iter(rungs.values())) < 2:
        raise SpecError("scale", "a ladder needs at least two rungs")
    for key in study.scale:
        check_key(key, f"scale.{key}", study.task)
        if key in study.sweep.keys:
            raise SpecError(f"scale.{key}", f"{key} is also swept: a key is either compared (sweep) or a rung (scale)")
    if study.tune is not None and any(key in study.tune.values for key in study.scale):
        raise SpecError("scale", "a tuned key cannot also be a rung")


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
    last = max(study.every_seed)
    if last + tune.seeds > MAX_SEED:  # the tuning seeds follow the largest final seed (tuning_seeds)
        raise SpecError("seeds", f"seed {last}: tune: trains on the {tune.seeds} seed(s) after the largest one, past "
                        f"{MAX_SEED}; give seeds up to {MAX_SEED - tune.seeds}")
    name, _, length = tune.metric.partition("@")
    lengths = study.task.get("eval_lengths") or [study.task["train_length"]]
    choices = [*get_variant("task", study.task["name"]).metrics, "loss"]
    if name not in choices:
        why = (" (run measures such as tokens_per_s are not chosen on validation data)" if name in RUN_MEASURES
               else " (descriptive: no better direction to choose by)" if name in DESCRIPTIVE_METRICS else "")
        raise SpecError("tune.metric", f"unknown metric {name!r}{why}" + suggest(name, choices),
                        [f"{c}@{lengths[0]}" for c in choices])
    if not length:
        length = str(study.task["train_length"])
    if "task.eval_lengths" not in study.sweep.keys and (not length.isdigit() or int(length) not in lengths):
        raise SpecError("tune.metric", f"{tune.metric!r}: no evaluation at length {length}",
                        [f"{name}@{n}" for n in lengths])
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
                resolve_axis(axis, value, field)  # a per-layer pattern is a value too
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


def check_expected_metric(exp: Expectation, field: str, study: TrainStudy) -> None:
    """An `expect:` entry's metric; a *_to_target one needs a target on an evaluated metric, a
    descriptive measure a stated `direction` (and only it takes one)."""
    descriptive = exp.metric.partition("@")[0] in DESCRIPTIVE_METRICS
    if exp.direction is not None and not descriptive:
        raise SpecError(f"{field}.direction", f"{exp.metric!r} has a better direction of its own; `direction` is only "
                        "for a descriptive measure", list(DESCRIPTIVE_METRICS))
    if exp.metric not in TO_TARGET:
        if exp.target is not None:
            raise SpecError(f"{field}.target", f"only {', '.join(TO_TARGET)} take a target; {exp.metric!r} is "
                            "compared on its final value")
        check_metric(exp.metric, f"{field}.metric", study, descriptive_ok=exp.direction is not None)
        return
    if exp.target is None:
        raise SpecError(f"{field}.target", f"{exp.metric} needs the score to reach: target: {{metric: metric@length, "
                        "value: number}")
    if exp.target.metric in RUN_MEASURES:
        raise SpecError(f"{field}.target.metric", "a target is a score the evaluations record, not a run measure")
    check_metric(exp.target.metric, f"{field}.target.metric", study)


def check_metric(metric: str, field: str, study: TrainStudy, descriptive_ok: bool = False) -> None:
    """`descriptive_ok`: an `expect:` entry that states the direction its claim expects of a
    descriptive measure (which the run must record: train.attention_entropy)."""
    task_cls = get_variant("task", study.task["name"])
    names = [*task_cls.metrics, "loss"]
    name, _, length = metric.partition("@")
    if metric in RUN_MEASURES or metric == FAILURE_SHARE:
        return
    if name in DESCRIPTIVE_METRICS and not descriptive_ok:
        raise SpecError(field, f"{name} is descriptive (no better direction): the report shows it; an `expect:` entry "
                        "tests it only with a stated `direction: lower` or `higher`", [*names, *RUN_MEASURES])
    if name in DESCRIPTIVE_METRICS:
        if not study.train.attention_entropy:
            raise SpecError(field, f"{name} is recorded only with train.attention_entropy: true")
        if length and length != str(study.task["train_length"]):
            raise SpecError(field, f"{name} is recorded at the training length only", [f"{name}@{study.task['train_length']}"])
        return
    if name not in names:
        choices = [*names, *RUN_MEASURES, FAILURE_SHARE]
        raise SpecError(field, f"unknown metric {name!r}" + suggest(name, choices), choices)
    lengths = study.task.get("eval_lengths") or [study.task["train_length"]]
    if length and "task.eval_lengths" not in study.sweep.keys and (not length.isdigit() or int(length) not in lengths):
        raise SpecError(field, f"{metric!r}: no evaluation at length {length}", [f"{name}@{n}" for n in lengths])
