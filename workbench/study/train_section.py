"""A study file's `train:` section: how each run trains (TrainConfig), with its optimizer,
compute budget, early stopping and Lightning callbacks, each validated before anything trains."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any, ClassVar, Literal

from pydantic import ConfigDict, Field, field_serializer, field_validator, model_validator

from workbench.cost.budget import BUDGET_STEP_CAP, StepCost, estimated_steps
from workbench.errors import SpecError
from workbench.model.spec import Choice, resolve_choice
from workbench.registry import variants
from workbench.study.yaml_file import suggest
from workbench.variants import StrictModel


# Lightning's registered strategy names, by their first word (ddp_spawn, deepspeed_stage_2, ...);
# tests/run/test_reliability.py checks them against Lightning's StrategyRegistry.
LIGHTNING_STRATEGIES = ("auto", "ddp", "deepspeed", "fsdp", "single", "xla")
# Lightning's strategies that start their ranks with multiprocessing instead of a command line:
# their rank 0 trains in a process whose recorded curves never return to the run.
SPAWNING_STRATEGIES = ("ddp_spawn", "ddp_fork", "ddp_notebook")


# Why a run over several processes (devices x num_nodes) is not the run on one: each rank
# averages the loss over the scored tokens of its share of the batch and DDP averages those
# means, which weighs tokens otherwise when the shares hold different numbers of them; and the
# ranks reduce in another order. So the process count is part of a run's identity (and the study
# hash), where devices and num_nodes themselves are execution fields.
PROCESSES_CHANGE_NUMBERS = ("runs over several processes (train.devices x train.num_nodes) average each rank's "
                            "mean loss over its share of every batch, so their numbers differ from one process's")


def world_size(train: Mapping[str, Any]) -> int | None:
    """Processes a run's `devices` x `num_nodes` ask for; None when Lightning decides (-1, 'auto')."""
    devices = train["devices"]
    if isinstance(devices, str) and devices != "auto":  # as Lightning reads it: '0,1' two devices, '2' two
        devices = len([d for d in devices.split(",") if d.strip()]) if "," in devices else int(devices)
    if not isinstance(devices, int) or devices < 0:
        return None
    return devices * train["num_nodes"]


class EarlyStopping(StrictModel):
    """Stop a run when its metric has not improved for `patience` evaluations in a row."""

    model_config = ConfigDict(extra="forbid")
    metric: str = Field(description="metric@length the run evaluates (e.g. loss@16); its direction is the task's")
    patience: int = Field(gt=0, description="evaluations without improvement before the run stops")
    min_delta: float = Field(0.0, ge=0, description="smallest change that counts as an improvement")


class CallbackPath(StrictModel):
    """A Lightning callback class by its import path, with keyword arguments for it."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)
    path: str = Field(pattern=r"^[A-Za-z_][\w.]*[.:][A-Za-z_]\w*$",
                      description="import path of a pytorch_lightning Callback subclass: package.module.Class "
                                  "(importing it runs that module's code)")
    args: dict[str, Any] = Field({}, description="keyword arguments of its constructor")


BUDGET_KINDS = ("flops", "tokens", "seconds")


class Budget(StrictModel):
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


class TrainConfig(StrictModel):
    """How each run trains. Execution fields (where and how it runs) do not change a run's id."""

    model_config = ConfigDict(extra="forbid")
    EXECUTION: ClassVar[tuple[str, ...]] = (
        "accelerator", "devices", "strategy", "num_nodes", "logger", "checkpoint_every", "eval_batch_size",
        "matmul_precision", "batch_seeds",
    )
    # Settings added after studies were run: part of a run's id and a study's hash only when they
    # differ from their default, so studies that never set them keep the ids and hashes they had.
    OPTIONAL: ClassVar[dict[str, Any]] = {
        "attention_entropy": False, "optimizer": {"name": "adamw", "betas": (0.9, 0.95), "eps": 1e-8},
        "grad_accumulation": 1,
        "early_stopping": None, "callbacks": [], "budget": None, "init_stream": 0,
        "init": "sequential",
    }

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
    init_stream: int = Field(
        0, ge=0, le=2**31 - 1,
        description="another stream of random initial weights (and dropout) for the same seed, data unchanged: sweep "
                    "[0, 1] with an expect: entry between them for an A/A noise check; 0 is the seed's own stream")
    init: Literal["sequential", "paired"] = Field(
        "sequential", description="how initial weights are drawn: 'sequential', every matrix in turn from the seed's "
        "torch stream (a module more or less shifts the draws of every matrix after it); 'paired', each matrix from a "
        "stream of its own seeded by (seed, init_stream, its name and shape), so the arms of a seed start equal in every "
        "matrix they share (common random numbers for the paired difference; docs/verdicts.md)")
    precision: Literal["32", "bf16-mixed", "16-mixed"] = Field(
        "32", description="'32' anywhere; 'bf16-mixed' on GPUs with bfloat16 (Ampere+); '16-mixed' on GPUs"
    )
    matmul_precision: Literal["high", "highest", "medium"] = Field(
        "high", description="float32 matmuls on CUDA (torch.set_float32_matmul_precision): 'high' TF32 (Ampere+), "
        "'highest' full float32 (a study about numerics), 'medium' bfloat16; the CPU keeps full float32")
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
        False, description="also record the attention measures at every evaluation, at the training length: "
        "attention_entropy (the mean entropy of the attention rows over the keys each can see, divided by ln(that "
        "number): 1 uniform, 0 a saturated softmax) and first_token_attention (the mean weight on the first key: "
        "the attention sink)")
    optimizer: Any = Field(
        "adamw", validate_default=True, description="adamw (default), adam, sgd, lion, muon or an installed plugin's "
        "(workbench list optimizer), by name or as {name: ..., <its arguments>}; train.lr and train.weight_decay apply "
        "to each")
    grad_accumulation: int = Field(
        1, gt=0, description="split each step's batch_size sequences into this many micro-batches whose gradients "
        "add up before the step (less memory, the same batch)")
    early_stopping: EarlyStopping | None = Field(
        None, description="{metric, patience}: stop when the metric has not improved for `patience` evaluations")
    callbacks: list[CallbackPath] = Field(
        [], description="Lightning callbacks added to every run, by import path (package.module.Class or "
        "{path: ..., args: {...}}); importing them runs their code; with callbacks a run takes one step per call of its "
        "training step (on_train_batch_end sees every step), without them up to 16")
    batch_seeds: int = Field(
        1, ge=1, le=1024, description="train up to this many seeds of a sweep point as one model with stacked weights "
        "(one loop and one optimizer step for all; each seed's own initial values, data and dropout, so its numbers "
        "are its run's alone up to float rounding): fewer, larger operations for small models, on a GPU above all")

    @field_validator("optimizer", mode="before")
    @classmethod
    def _optimizer(cls, v):
        data = {"name": v} if isinstance(v, str) else v
        if not isinstance(data, Mapping) or not isinstance(data.get("name"), str):
            raise SpecError("train.optimizer", "give an optimizer name or {name: ..., <arguments>}", variants("optimizer"))
        name = data["name"].lower()
        if name in variants("optimizer"):  # an unknown name is named with the choices by resolve_choice below
            known = variants("optimizer")[name].Params.model_fields
            for key in data:
                if key != "name" and key not in known:
                    raise SpecError(f"train.optimizer.{key}", f"not an argument of {name}" + suggest(key, list(known)),
                                    list(known))
        return resolve_choice("optimizer", {**data, "name": name}, "train.optimizer")

    @field_serializer("optimizer")
    def _optimizer_mapping(self, choice: Choice) -> dict[str, Any]:
        return {"name": choice.name, **choice.params.model_dump()}

    @field_validator("callbacks", mode="before")
    @classmethod
    def _callbacks(cls, v):
        return [{"path": c} if isinstance(c, str) else c for c in v] if isinstance(v, list) else v

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
        if v in SPAWNING_STRATEGIES:
            raise SpecError("train.strategy", f"{v!r} trains rank 0 in a process started by multiprocessing, whose "
                            "recorded curves and evaluations never return to the run; use 'ddp' (the same training: "
                            "Lightning starts each rank as a process of its own)")
        return v

    @model_validator(mode="after")
    def _batch_shared_by_processes(self):
        size = world_size(self.model_dump())
        if size and self.batch_size % size:
            raise SpecError("train.batch_size", f"{self.batch_size} sequences cannot be shared equally by the "
                            f"{size} processes of devices x num_nodes; use a multiple of {size}")
        return self

    @model_validator(mode="after")
    def _one_budget(self):
        if [self.steps, self.tokens, self.budget].count(None) != 2:
            raise SpecError("train.steps", "give exactly one training budget: steps, tokens or budget")
        if self.budget is not None and self.budget.kind == "seconds" and self.eval_every is None:
            raise SpecError("train.eval_every", "with budget.seconds the number of steps is not known in advance: "
                            "say how often to evaluate (train.eval_every: N steps)")
        if self.batch_size % self.grad_accumulation:
            raise SpecError("train.grad_accumulation", f"{self.grad_accumulation} micro-batches do not divide "
                            f"train.batch_size {self.batch_size} evenly")
        # A budget cuts the step that reaches it to the sequences it still pays for, as one process
        # spending it alone: a step split into micro-batches, or shared by ranks that would each
        # decide on their own share, would be cut apart.
        if self.budget is not None and self.grad_accumulation > 1:
            raise SpecError("train.grad_accumulation", "a compute budget (train.budget) cuts the last step to what it "
                            "still pays for, which micro-batches would split: use grad_accumulation 1 with a budget, "
                            "or train.steps / train.tokens")
        if self.budget is not None and world_size(self.model_dump()) != 1:
            raise SpecError("train.devices", "a compute budget (train.budget) is spent by one process: use devices: 1 "
                            "and num_nodes: 1 with a budget, or train.steps / train.tokens with several processes")
        return self

    @model_validator(mode="after")
    def _batched_seeds(self):
        """What batched seeds cannot do: each member would need its own budget, stop, processes,
        micro-batches, callbacks, tracker run or optimizer update (one that reads a whole matrix)."""
        if self.batch_seeds == 1:
            return self
        elementwise = ", ".join(name for name, cls in variants("optimizer").items() if cls.elementwise)
        for field_, given, why in (
            ("train.budget", self.budget is not None, "a budget stops each run at its own step"),
            ("train.early_stopping", self.early_stopping is not None, "early stopping ends each run on its own"),
            ("train.grad_accumulation", self.grad_accumulation > 1, "micro-batches of stacked seeds are not supported"),
            ("train.devices", world_size(self.model_dump()) != 1, "a batched model trains in one process"),
            ("train.callbacks", bool(self.callbacks), "a callback sees one run's module, not a batch of them"),
            ("train.logger", self.logger != "csv", "a tracker run names one run"),
            ("train.optimizer", not self.optimizer.cls.elementwise,
             f"{self.optimizer.name} updates each weight matrix as a whole, so K seeds' matrices stacked in one tensor "
             f"would not each update as alone (optimizers that update element by element do: {elementwise})"),
        ):
            if given:
                raise SpecError(field_, f"cannot be used with train.batch_seeds {self.batch_seeds}: {why}; use "
                                "batch_seeds: 1 (each seed trained alone)")
        return self

    @classmethod
    def defining(cls, train: Mapping[str, Any]) -> dict[str, Any]:
        """The fields of a training section that decide what a run computes (no execution
        fields, no optional setting at its default), and, for a run over several processes,
        their number and strategy (PROCESSES_CHANGE_NUMBERS): one process has neither, so every
        run id made before stays."""
        out = {k: v for k, v in train.items() if k not in cls.EXECUTION
               and not (k in cls.OPTIONAL and comparable(v) == comparable(cls.OPTIONAL[k]))}
        size = world_size(train)
        if size != 1:
            out["processes"] = size if size is not None else f"{train['devices']} x {train['num_nodes']} nodes"
            out["strategy"] = train["strategy"]
        return out

    def resolved(self, train_length: int, cost: StepCost | None = None) -> dict[str, Any]:
        """Every field filled in: steps from tokens (or, estimated, from a counted budget and the
        run's `cost` per step), eval and checkpoint intervals."""
        out = self.model_dump()
        if self.budget is None:
            steps = self.steps or -(-self.tokens // (self.batch_size * train_length))
        elif self.budget.kind == "seconds":
            steps = BUDGET_STEP_CAP  # the run stops on time (workbench.run.recording)
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


def comparable(value: Any) -> Any:
    """A setting as plain JSON data (tuples as lists), for comparing with its default."""
    return json.loads(json.dumps(value, default=str))
