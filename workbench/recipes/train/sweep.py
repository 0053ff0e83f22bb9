"""Sweep expansion: a study -> a flat list of fully resolved run configs.

    points = grid keys (product)  x  each zip group (keys varying together)
    runs   = points x seeds, in that order

With `tune:` a study has two stages (workbench.recipes.train.tuning chooses between them):

    tuning runs = points x candidate values x `tune.seeds` seeds past the final ones, split "validation"
    final runs  = points x seeds, each point at its chosen values (ordinary runs)

Every run is validated here (task parameters, model spec with the task's vocabulary, training
section), so `workbench validate` catches a bad combination before anything trains.

Sizes are bounded before anything is built: at most WORKBENCH_MAX_RUNS runs per study, and
each run's estimated parameters and activation memory under WORKBENCH_MAX_PARAMS and
WORKBENCH_MAX_ACTIVATION_BYTES (environment variables; the defaults refuse only the absurd).
"""

from __future__ import annotations

import copy
import functools
import json
from typing import Any

import torch

from workbench.cost.budget import StepCost, step_cost
from workbench.errors import SpecError
from workbench.model.transformer import build_model
from workbench.registry import get_variant
from workbench.model.spec import parse_spec
from workbench.results import VALIDATION, RunConfig
from workbench.recipes.train.study import TrainStudy
from workbench.study import StudyFile, task_section, unwrap
from workbench.study.keys import canonical_json, digest, label, set_dotted
from workbench.study.train_section import TrainConfig, world_size
from workbench.study.yaml_file import StudyError, limit
from pydantic import ValidationError

def estimated_parameters(model: dict[str, Any]) -> int:
    """Parameters of a resolved model spec, from its weight matrices and embeddings (norms,
    biases and position tables are left out; a given d_ff is counted as gated): an estimate
    for refusing absurd models, within 20% of the built model's count for typical shapes."""
    d, heads, kv, hd = model["d_model"], model["n_heads"], model["n_kv_heads"], model["head_dim"]
    attention = d * hd * 2 * (heads + kv)  # q and o: heads * hd each; k and v: kv * hd each
    d_ff = model["ffn"].get("d_ff")
    ffn = 3 * d * d_ff if d_ff else 8 * d * d  # 4x MLP or 8/3x gated: 8 d^2 either way
    if model["family"] == "encoder_decoder":
        enc = model["n_encoder_layers"] or model["n_layers"]
        dec = model["n_decoder_layers"] or model["n_layers"]
        blocks = enc * (attention + ffn) + dec * (2 * attention + ffn)  # decoder blocks add cross-attention
    else:
        blocks = model["n_layers"] * (attention + ffn)
    embeddings = model["vocab_size"] * d * (1 if model["tie_embeddings"] else 2)
    return blocks + embeddings


def estimated_activation_bytes(model: dict[str, Any], batch: int, length: int, layers: int) -> int:
    """Activation memory of `layers` stored layers on a batch: s*b*h*(34 + 5*a*s/h) bytes per
    layer in 16-bit (Korthikanti et al. 2022, "Reducing Activation Recomputation", eq. 1),
    doubled for 32-bit floats, plus the logits."""
    d, heads = model["d_model"], model["n_heads"]
    per_layer = length * batch * d * (34 + 5 * heads * length / d) * 2
    return int(per_layer * layers + 2 * 4 * batch * length * model["vocab_size"])


def check_size(train_length: int, eval_lengths: list[int], model: dict[str, Any], train: dict[str, Any]) -> None:
    """Refuse, at validate, a run too large to be meant: the numbers computed, and how to allow it."""
    params = estimated_parameters(model)
    if params > limit("WORKBENCH_MAX_PARAMS"):
        raise SpecError("model.d_model", f"about {params:.3g} parameters (estimated from the model's shapes), over "
                        f"the limit of {limit('WORKBENCH_MAX_PARAMS'):.3g}; make the model smaller, or set "
                        "WORKBENCH_MAX_PARAMS to allow it")
    layers = model["n_layers"] * (2 if model["family"] == "encoder_decoder" else 1)
    for field_, batch, length, stored in (
        ("train.batch_size", train["batch_size"], train_length, layers),  # backward keeps every layer
        ("train.eval_batch_size", train["eval_batch_size"], max([train_length, *eval_lengths]), 1),  # evaluation keeps one at a time
    ):
        needed = estimated_activation_bytes(model, batch, length, stored)
        if needed > limit("WORKBENCH_MAX_ACTIVATION_BYTES"):
            raise SpecError(field_, f"{batch} sequences of length {length} need about {needed / 2**30:.3g} GiB of "
                            f"activations (estimate), over the limit of {limit('WORKBENCH_MAX_ACTIVATION_BYTES') / 2**30:.3g} "
                            "GiB; use a smaller batch, or set WORKBENCH_MAX_ACTIVATION_BYTES to allow it")


def sweep_points(study: TrainStudy) -> list[dict[str, Any]]:
    """Every combination of swept values as {dotted.key: value} (one {} when nothing is swept)."""
    return study.sweep.points()


def run_identity(config: dict[str, Any]) -> dict[str, Any]:
    """What a run computes; where it runs (accelerator, logger, ...) is not part of it."""
    task = get_variant("task", config["task"]["name"]).defining(config["task"])
    identity = {"task": task, "model": config["model"], "train": TrainConfig.defining(config["train"]),
                "seed": config["seed"]}
    if "split" in config:  # tuning runs only: every other run keeps the id it always had
        identity["split"] = config["split"]
    return identity


def training_identity(config: dict[str, Any]) -> str | None:
    """What a run trains, without what it only evaluates (its task's evaluation_params, the
    attention entropy it records): runs with the same one train one model. None for a run that
    trains alone: its early stopping reads its own evaluations, its tracker names one run, or it
    trains over several processes."""
    train = config["train"]
    if train.get("early_stopping") or train["logger"] != "csv" or world_size(train) != 1:
        return None
    evaluation = get_variant("task", config["task"]["name"]).evaluation_params()
    identity = run_identity(config)
    identity["task"] = {k: v for k, v in identity["task"].items() if k not in evaluation}
    identity["train"] = {k: v for k, v in identity["train"].items() if k != "attention_entropy"}
    return digest(identity)


def training_groups(runs: list[RunConfig]) -> list[list[RunConfig]]:
    """`runs` as the trainings they need: runs that differ only in how they evaluate (e.g. the
    decoding study's strategies at one seed) share one, in the order their first run comes."""
    groups: dict[Any, list[RunConfig]] = {}
    for run in runs:
        groups.setdefault(training_identity(run.config) or run.run_id, []).append(run)
    return list(groups.values())


def batched_trainings(runs: list[RunConfig]) -> list[list[list[RunConfig]]]:
    """`runs` as jobs of trainings (training_groups): with `train.batch_seeds: K`, up to K
    trainings of one sweep point that differ only in their seed, in their order, train as one
    batched model (workbench.run.batched); any other training is a job of its own."""
    jobs: list[list[list[RunConfig]]] = []
    open_: dict[str, list[list[RunConfig]]] = {}  # a point's batch still filling
    for training in training_groups(runs):
        config = training[0].config
        size = config["train"].get("batch_seeds", 1)
        point = training_identity({**config, "seed": None}) if size > 1 else None
        if point is None:
            jobs.append([training])
            continue
        batch = open_.get(point)
        if batch is None or len(batch) == size:
            batch = open_[point] = []
            jobs.append(batch)
        batch.append(training)
    return jobs


def resolve_point(study: TrainStudy, point: dict[str, Any]) -> dict[str, Any]:
    """Task, model and training sections of one sweep point, validated and fully resolved."""
    raw = {"task": copy.deepcopy(study.task), "model": copy.deepcopy(study.model),
           "train": study.train.model_dump(exclude_unset=True)}
    for key, value in point.items():
        set_dotted(raw, key, value)
    task = task_section(raw["task"])
    task_cls = get_variant("task", task["name"])
    task_obj = task_cls.planned(task_cls.Params.model_validate({k: v for k, v in task.items() if k != "name"}))
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
    check_size(task["train_length"], list(task_obj.eval_lengths), model, train.model_dump())
    cost = None
    if train.budget is not None and train.budget.kind != "seconds":  # counted only for a counted budget
        cost = point_step_cost(canonical_json(model), canonical_json(task), train.batch_size)
    resolved = train.resolved(task["train_length"], cost)
    return {"task": task, "model": model, "train": resolved}


@functools.lru_cache(maxsize=256)
def point_step_cost(model_json: str, task_json: str, batch_size: int) -> StepCost:
    """The cost of one training step of a resolved model on a task's batch 0 (FLOPs and tokens
    do not depend on the weights or the seed's data for fixed-length batches); counted once
    per model and task, on a forked random state so that expanding a study draws nothing."""
    model, task = json.loads(model_json), json.loads(task_json)
    task_cls = get_variant("task", task["name"])
    task_obj = task_cls.planned(task_cls.Params.model_validate({k: v for k, v in task.items() if k != "name"}))
    with torch.random.fork_rng(devices=[]):
        net = build_model(model)
    batch = task_obj.train_batch(0, batch_size, model["family"])
    return step_cost(net, lambda b: task_obj.loss(net, b, model["family"]), batch)


def check_position_limit(spec, task_obj, task: dict[str, Any]) -> None:
    """A position scheme with a fixed table (learned) must cover the training sequences; past
    the training length, a too-short table is by design recorded as not applicable."""
    limits = [(choice.name, choice.cls(choice.params, d_model=spec.d_model, n_heads=spec.n_heads,
                                       head_dim=spec.head_dim).max_length) for choice in spec.each("position")]
    limits = [(name, limit) for name, limit in limits if limit is not None]
    if not limits:
        return
    name, limit = min(limits, key=lambda pair: pair[1])
    batches = [task_obj.train_batch(0, 8, spec.family), *task_obj.eval_batches(task["train_length"], 64, spec.family)]
    longest = max(batch[key].shape[-1] for batch in batches for key in ("tokens", "src", "tgt") if key in batch)
    if longest > limit:
        raise SpecError("model.position", f"{name} covers {limit} positions, but training sequences "
                        f"are up to {longest} tokens long (task.train_length={task['train_length']}); "
                        f"raise max_len to at least {longest}")


def locate(study_file: StudyFile, point: dict[str, Any], swept: dict[str, Any], err: SpecError,
           tuned: dict[str, Any] | None = None) -> Exception:
    """Point an error of one sweep point at its cause: the swept (or tuned) key when the bad
    field is swept (or tuned); the field itself when the study is wrong without any sweep;
    otherwise the sweep (a combination of a swept value with the rest of the study)."""
    study = study_file.study
    tuned = tuned or {}
    context = f"in the sweep point {' '.join(f'{k}={v}' for k, v in swept.items())}"
    if err.field in tuned:
        return study_file.error(SpecError(f"tune.{err.field}", err.problem, err.choices), context)
    if not point:
        return study_file.error(err)
    if err.field in point:
        return study_file.error(SpecError(study.sweep.field(err.field), err.problem, err.choices), context)
    try:
        resolve_point(study, {})
    except SpecError as base_err:
        return study_file.error(base_err)
    line = study_file.lines.line(study.sweep.field(next(iter(point))))
    return StudyError(str(study_file.path), line, SpecError(err.field, f"{err.problem} ({context})", err.choices))


def point_key(swept: dict[str, Any], keys: list[str]) -> str:
    """A sweep point's identity from its runs' value labels on the swept `keys` (tuning runs
    and final runs of one point share it)."""
    return canonical_json({key: swept.get(key) for key in keys})


def expand(study_file: StudyFile, chosen: dict[str, dict[str, Any]] | None = None,
           seeds: dict[str, int] | None = None) -> list[RunConfig]:
    """The (final) runs of a train study, each validated; SpecErrors become StudyErrors that
    point at the swept key (when the bad field is swept) or at the field's own line.

    With `tune:`, `chosen` maps a point's `point_key` to its chosen {tuned key: value}; a
    point without a choice (its tuning is not done) has no final runs yet. With adaptive
    seeds, `seeds` maps a point's `point_key` to how many of the plan's seeds it runs (the
    first ones when absent)."""
    study = study_file.study
    if not isinstance(study, TrainStudy):
        raise TypeError(f"expand() takes a train study, got kind {study.kind!r}")
    runs: list[RunConfig] = []
    seen: dict[str, RunConfig] = {}
    most = len(study.every_seed)
    n_runs = study.sweep.size() * most
    if n_runs > limit("WORKBENCH_MAX_RUNS"):
        raise study_file.error(SpecError(
            "sweep", f"{study.sweep.size()} sweep points x {most} seeds = {n_runs} runs, over the limit of "
            f"{limit('WORKBENCH_MAX_RUNS')}; sweep fewer values, or set WORKBENCH_MAX_RUNS to allow it"))
    for i, point in enumerate(sweep_points(study)):
        key = point_key({k: label(v) for k, v in point.items()}, study.sweep.keys)
        tuned: dict[str, Any] = {}
        if study.tune is not None:
            tuned = (chosen or {}).get(key)
            if tuned is None:
                continue
        mine = study.every_seed[: (seeds or {}).get(key, len(study.seeds))]
        runs += point_runs(study_file, point, tuned, mine, i * most, seen)
    return runs


def tuning_runs(study_file: StudyFile, extra: dict[str, list[dict[str, Any]]] | None = None) -> list[RunConfig]:
    """The tuning runs of a study with `tune:` (none without): every sweep point at every
    candidate value, on the tuning seeds (disjoint from the final ones), evaluated on
    validation sets; `extra` adds candidates per point (point_key -> [{tuned key: value}]),
    the grid's extension past an edge (workbench.recipes.train.tuning). Indices follow the final runs'."""
    study = study_file.study
    if not isinstance(study, TrainStudy) or study.tune is None:
        return []
    points = sweep_points(study)
    runs: list[RunConfig] = []
    seen: dict[str, RunConfig] = {}
    for point in points:
        key = point_key({k: label(v) for k, v in point.items()}, study.sweep.keys)
        for tuned in [*study.tune.points(), *(extra or {}).get(key, [])]:
            index = len(points) * len(study.every_seed) + len(runs)
            runs += point_runs(study_file, point, tuned, study.tuning_seeds, index, seen, split=VALIDATION)
    return runs


def point_runs(study_file: StudyFile, point: dict[str, Any], tuned: dict[str, Any], seeds: list[int], index: int,
               seen: dict[str, RunConfig], split: str | None = None) -> list[RunConfig]:
    """One sweep point's runs (one per seed) with the `tuned` values set, numbered from
    `index`; a run identical to one in `seen` is a StudyError naming both."""
    study = study_file.study
    swept = {key: label(value) for key, value in {**point, **tuned}.items()}
    try:
        resolved = resolve_point(study, {**point, **tuned})
    except SpecError as err:
        raise locate(study_file, point, swept, err, tuned) from None
    if split is not None:
        check_tune_metric(study_file, resolved, swept)
        resolved["split"] = split
    runs = []
    for seed in seeds:
        config = {**resolved, "seed": seed}
        run = RunConfig(run_id=digest(run_identity(config)), index=index + len(runs), seed=seed, swept=swept,
                        config=config)
        if run.run_id in seen:
            first = seen[run.run_id]
            field_ = (f"tune.{next(iter(tuned))}" if split is not None and tuned
                      else study.sweep.field(next(iter(point))) if point else "seeds")
            raise study_file.error(SpecError(
                field_, f"runs '{first.describe}' and '{run.describe}' are identical (a repeated value?)"))
        seen[run.run_id] = run
        runs.append(run)
    return runs


def check_tune_metric(study_file: StudyFile, resolved: dict[str, Any], swept: dict[str, Any]) -> None:
    """The tuning metric's length is one this point evaluates at (eval lengths may be swept)."""
    metric = study_file.study.tune.metric
    lengths = resolved["task"].get("eval_lengths") or [resolved["task"]["train_length"]]
    if int(metric.partition("@")[2]) not in lengths:
        name = metric.partition("@")[0]
        raise study_file.error(SpecError("tune.metric", f"{metric!r}: no evaluation at that length",
                                         [f"{name}@{n}" for n in lengths]),
                               f"in the sweep point {' '.join(f'{k}={v}' for k, v in swept.items())}")


class TrainPlan:
    """Every run of a train study by stage, expanded from the study once and handed to each
    stage of the recipe (workbench.recipes.train.recipe): the tuning runs (with `tune:`), the
    final runs (at once without `tune:`, at each point's chosen values once tuning has chosen)
    and the seed rounds of adaptive seeds. A stage tells the plan what it learned (candidates
    past a grid edge, the choice, the seeds each point gets) and the plan expands only the runs
    that adds."""

    def __init__(self, study_file: StudyFile):
        self.study_file = study_file
        self.study: TrainStudy = study_file.study
        self.tuning = tuning_runs(study_file)  # none without `tune:`
        self.chosen: dict[str, dict[str, Any]] | None = None  # point_key -> chosen values, once tuned
        self.finals: list[RunConfig] | None = expand(study_file) if self.study.tune is None else None

    @property
    def known(self) -> list[RunConfig]:
        """The runs known before anything trains: the tuning runs, and the final runs without `tune:`."""
        return [*self.tuning, *(self.finals or [])]

    @property
    def total(self) -> int:
        """The runs a sweep counts at its start (more past a grid edge, and with adaptive seeds)."""
        return len(self.tuning) + len(self.study.sweep.points()) * len(self.study.seeds)

    def candidate_finals(self) -> list[RunConfig]:
        """Every final run the study could have (what --fresh clears): with `tune:`, each point
        at each candidate."""
        if self.finals is not None:
            return self.finals
        points = [point_key({k: label(v) for k, v in p.items()}, self.study.sweep.keys) for p in self.study.sweep.points()]
        return [run for values in self.study.tune.points()
                for run in expand(self.study_file, dict.fromkeys(points, values))]

    def extended_tuning(self, extra: dict[str, list[dict[str, Any]]]) -> list[RunConfig]:
        """The tuning runs with `extra` candidates per point (point_key -> [{tuned key: value}]) past an edge."""
        return tuning_runs(self.study_file, extra)

    def choose(self, chosen: dict[str, dict[str, Any]]) -> list[RunConfig]:
        """The final runs at each point's chosen values (a point without a choice has none)."""
        self.chosen = chosen
        self.finals = expand(self.study_file, chosen)
        return self.finals

    def seed_round(self, seeds: dict[str, int]) -> list[RunConfig]:
        """The final runs when each point (point_key) runs the first `seeds[point]` of the plan's seeds."""
        return expand(self.study_file, self.chosen, seeds)
