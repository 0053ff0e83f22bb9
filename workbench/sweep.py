"""Sweep expansion: a study -> a flat list of fully resolved run configs.

    points = grid keys (product)  x  each zip group (keys varying together)
    runs   = points x seeds, in that order

Every run is validated here (task parameters, model spec with the task's vocabulary, training
section), so `workbench validate` catches a bad combination before anything trains.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

from workbench.errors import SpecError
from workbench.registry import get_variant
from workbench.spec import parse_spec
from workbench.study import (
    StudyError,
    StudyFile,
    TrainConfig,
    TrainStudy,
    digest,
    label,
    set_dotted,
    task_section,
    unwrap,
)
from pydantic import ValidationError


@dataclass(frozen=True)
class RunConfig:
    """One run of a sweep: plain data, picklable, the same on every machine."""

    run_id: str  # hash of what the run computes (task, model, training, seed)
    index: int  # position in the sweep, for stable ordering in tables
    seed: int
    swept: dict[str, Any]  # dotted key -> value label (a flat column of the results table)
    config: dict[str, Any] = field(repr=False)  # {"task": ..., "model": ..., "train": ..., "seed": ...}

    @property
    def describe(self) -> str:
        values = " ".join(f"{k}={v}" for k, v in self.swept.items())
        return f"{values} seed={self.seed}".strip()


def sweep_points(study: TrainStudy) -> list[dict[str, Any]]:
    """Every combination of swept values as {dotted.key: value} (one {} when nothing is swept)."""
    return study.sweep.points()


def run_identity(config: dict[str, Any]) -> dict[str, Any]:
    """What a run computes; where it runs (accelerator, logger, ...) is not part of it."""
    train = {k: v for k, v in config["train"].items() if k not in TrainConfig.EXECUTION}
    return {"task": config["task"], "model": config["model"], "train": train, "seed": config["seed"]}


def resolve_point(study: TrainStudy, point: dict[str, Any]) -> dict[str, Any]:
    """Task, model and training sections of one sweep point, validated and fully resolved."""
    raw = {"task": copy.deepcopy(study.task), "model": copy.deepcopy(study.model),
           "train": study.train.model_dump(exclude_unset=True)}
    for key, value in point.items():
        set_dotted(raw, key, value)
    task = task_section(raw["task"])
    task_cls = get_variant("task", task["name"])
    task_obj = task_cls(task_cls.Params.model_validate({k: v for k, v in task.items() if k != "name"}), seed=0)
    family = raw["model"].get("family", "decoder")
    overrides = task_obj.model_overrides(family)
    for key, value in overrides.items():
        given = raw["model"].get(key)
        if given is not None and given != value:
            raise SpecError(f"model.{key}", f"the task {task['name']!r} sets it to {value}: remove it from the study")
    spec = parse_spec({**raw["model"], **overrides})
    check_position_limit(spec, task_obj, task)
    model = spec.resolved()
    try:
        train = TrainConfig.model_validate(raw["train"])
    except ValidationError as err:
        raise unwrap(err, "train") from None
    return {"task": task, "model": model, "train": train.resolved(task["train_length"])}


def check_position_limit(spec, task_obj, task: dict[str, Any]) -> None:
    """A position scheme with a fixed table (learned) must cover the training sequences; past
    the training length, a too-short table is by design recorded as not applicable."""
    scheme = spec.position.cls(spec.position.params, d_model=spec.d_model, n_heads=spec.n_heads,
                               head_dim=spec.dim_head)
    limit = scheme.max_length
    if limit is None:
        return
    batches = [task_obj.train_batch(0, 8, spec.family), *task_obj.eval_batches(task["train_length"], 64, spec.family)]
    longest = max(batch[key].shape[-1] for batch in batches for key in ("tokens", "src", "tgt") if key in batch)
    if longest > limit:
        raise SpecError("model.position", f"{spec.position.name} covers {limit} positions, but training sequences "
                        f"are up to {longest} tokens long (task.train_length={task['train_length']}); "
                        f"raise max_len to at least {longest}")


def locate(study_file: StudyFile, point: dict[str, Any], swept: dict[str, Any], err: SpecError) -> Exception:
    """Point an error of one sweep point at its cause: the swept key when the bad field is
    swept; the field itself when the study is wrong without any sweep; otherwise the sweep
    (a combination of a swept value with the rest of the study)."""
    study = study_file.study
    if not point:
        return study_file.error(err)
    context = f"in the sweep point {' '.join(f'{k}={v}' for k, v in swept.items())}"
    if err.field in point:
        return study_file.error(SpecError(study.sweep.field(err.field), err.problem, err.choices), context)
    try:
        resolve_point(study, {})
    except SpecError as base_err:
        return study_file.error(base_err)
    line = study_file.lines.line(study.sweep.field(next(iter(point))))
    return StudyError(str(study_file.path), line, SpecError(err.field, f"{err.problem} ({context})", err.choices))


def expand(study_file: StudyFile) -> list[RunConfig]:
    """The runs of a train study, each validated; SpecErrors become StudyErrors that point at
    the swept key (when the bad field is swept) or at the field's own line."""
    study = study_file.study
    if not isinstance(study, TrainStudy):
        raise TypeError(f"expand() takes a train study, got kind {study.kind!r}")
    runs: list[RunConfig] = []
    seen: dict[str, RunConfig] = {}
    for point in sweep_points(study):
        swept = {key: label(value) for key, value in point.items()}
        try:
            resolved = resolve_point(study, point)
        except SpecError as err:
            raise locate(study_file, point, swept, err) from None
        for seed in study.seeds:
            config = {**resolved, "seed": seed}
            run = RunConfig(run_id=digest(run_identity(config)), index=len(runs), seed=seed, swept=swept,
                            config=config)
            if run.run_id in seen:
                first = seen[run.run_id]
                field_ = study.sweep.field(next(iter(point))) if point else "seeds"
                raise study_file.error(SpecError(
                    field_, f"runs '{first.describe}' and '{run.describe}' are identical (a repeated value?)"))
            seen[run.run_id] = run
            runs.append(run)
    return runs
