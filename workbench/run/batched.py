"""Several seeds of one sweep point trained as one model (`train.batch_seeds: K`): their weights
stacked along a first dimension, one Lightning loop and one optimizer step for all of them.

    BatchedRunModule  K members, each built exactly as its own run builds its model (its seed,
                      its init, the draws its step-cost count makes), their parameters stacked
                      (torch.func.stack_module_state). A step computes each member's loss on its
                      own batch: through torch.func.vmap over functional_call when the model allows
                      it (the masks the model branches on are the same for every member, e.g. no
                      padding), else one functional_call per member, each under its own random
                      state (its dropout draws are those of its run alone). The auxiliary loss
                      terms its modules add (workbench.model.losses) join each member's loss and
                      curves, as in its run. Each member's gradient is clipped by its own norm;
                      the optimizer (one that updates element by element: Optimizer.elementwise,
                      checked at validation) then acts on the stacked tensors as it would on
                      each member's.
    BatchedRecorder   each member's RunRecorder (its curves, evaluations, siblings) and progress
                      file, fed with its own loss and tokens; evaluations load a member's weights
                      into a copy of its model.

So each member's curves and final metrics equal those of its run trained alone up to float
rounding (the clipping norm and the batched matrix products sum in another order):
tests/run/test_batched_seeds.py checks it at float64. The model stays a black box: it is called
through functional_call with a member's parameters and buffers, never changed. A member whose
loss is not finite is recorded diverged at that step and leaves the sum; the others go on.

`batch_seeds` is an execution field (a run's id and the study hash do not hold it), like the
accelerator: it changes how runs train, not what they compute.
"""

from __future__ import annotations

import copy
import functools
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytorch_lightning as pl
import torch
from pytorch_lightning.callbacks import Callback
from pytorch_lightning.utilities.exceptions import SIGTERMException
from torch import nn
from torch.func import functional_call, stack_module_state, vmap

from workbench import stopping
from workbench.hardware import cpu_seconds, run_threads
from workbench.cost.budget import step_cost
from workbench.model.losses import collect
from workbench.model.optimizers import build_optimizer
from workbench.model.weights import make_task
from workbench.results import LAST_CHECKPOINT, RunResult, Status
from workbench.run.batches import StepBatches, StepSampler
from workbench.run.distributed import lightning_strategy
from workbench.run.environment import matmul_precision, resolve_accelerator
from workbench.run.jobs import Job
from workbench.run.recording import PeakMemory, ProgressFile, RunRecorder
from workbench.run.run_module import RunModule, lr_factor
from workbench.run.tracking import make_logger
from workbench.run.train import (Checkpoints, NoProfiler, SafeCheckpointIO, close_tracker, quiet_lightning,
                                 record_error, record_spending, run_environment, set_torch_globals, sibling_result,
                                 start_run_folder, torch_globals, write_results)
from workbench.study.keys import digest


# What torch.func.vmap's refusals say (data-dependent control flow, .item(), dynamic shapes such as
# a mixture of experts' routing): the members' losses are then computed one call each.
VMAP_LIMITS = ("vmap", "batching rule")


class Calls(nn.Module):
    """A model's methods by name, so that functional_call (which calls forward) reaches any of
    them (a decoder's forward, an encoder's classify)."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, method: str, *args, **kwargs):
        return getattr(self.model, method)(*args, **kwargs)


def aliases(module: nn.Module) -> dict[str, str]:
    """Every name of the module's parameters and buffers (a tied weight has several) -> the
    name stack_module_state gives it (its first)."""
    out = {}
    for named in (module.named_parameters, module.named_buffers):
        first = {id(t): name for name, t in named()}
        out.update({name: first[id(t)] for name, t in named(remove_duplicate=False)})
    return out


class Member:
    """One member of the stacked model, as a task's loss calls a model: its calls run the model
    with that member's parameters and buffers (functional_call), every tied name given, so the
    call does not depend on whether the module still ties them (a call's restore unties them)."""

    def __init__(self, calls: Calls, names: dict[str, str], values: dict[str, torch.Tensor]):
        self.calls = calls
        self.values = {alias: values[name] for alias, name in names.items()}
        self.params = values

    def parameters(self):
        return iter(self.params.values())

    def _call(self, method: str, *args, **kwargs):
        return functional_call(self.calls, self.values, (method, *args), kwargs, tie_weights=False)

    def __call__(self, *args, **kwargs):
        return self._call("forward", *args, **kwargs)

    def classify(self, *args, **kwargs):
        return self._call("classify", *args, **kwargs)


def key(name: str) -> str:
    return name.replace(".", "__")  # ParameterDict and buffer names hold no dots


class BatchedRunModule(pl.LightningModule):
    """K members' models as stacked parameters; see the module's docstring."""

    def __init__(self, members: Sequence[RunModule], tasks: Sequence[Any], rng_states: list[torch.Tensor] | None):
        super().__init__()
        first = members[0]
        self.family, self.train_cfg, self.tasks = first.family, first.train_cfg, list(tasks)
        params, buffers = stack_module_state([Calls(m.model) for m in members])
        self.names, self.buffer_names = list(params), list(buffers)
        self.stacked = nn.ParameterDict({key(n): nn.Parameter(p) for n, p in params.items()})
        for name, value in buffers.items():
            self.register_buffer(key(name), value)
        # In a list, so that no checkpoint holds them (not submodules): a copy of the model that
        # functional_call runs with a member's parameters and buffers (its plain tensor attributes,
        # such as position tables, are its own), and one that evaluations load a member's weights into.
        self.parts = [Calls(copy.deepcopy(first.model)), copy.deepcopy(first.model)]
        self.aliases = aliases(self.parts[0])
        self.rng_states = rng_states  # per member, with dropout: each member draws from its own stream
        self.diverged: list[int | None] = [None] * len(members)
        self.vmap_failed: set[frozenset[str]] = set()  # batched input keys the model cannot take under vmap
        self.vmap_steps = 0  # steps whose losses went through vmap
        self.budget_kind, self.last_step = None, None  # RunRecorder reads them (batched runs have no budget)

    def __setattr__(self, name: str, value: Any) -> None:
        if name == "_current_fx_name":  # as RunModule: Lightning sets it around every hook call
            object.__setattr__(self, name, value)
        else:
            super().__setattr__(name, value)

    @property
    def size(self) -> int:
        return len(self.diverged)

    def member_params(self, members: Sequence[int] | None) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
        """Stacked parameters and buffers by the model's names: all members, or those listed."""
        pick = (lambda t: t) if members is None or len(members) == self.size else (lambda t: t[list(members)])
        return ({n: pick(self.stacked[key(n)]) for n in self.names},
                {n: pick(getattr(self, key(n))) for n in self.buffer_names})

    def member_weights(self, k: int) -> nn.Module:
        """A model holding member k's current weights (the evaluation copy, reloaded)."""
        model = self.parts[1]
        with torch.no_grad():
            for name, value in model.named_parameters():
                value.copy_(self.stacked[key("model." + name)][k])
            for name, value in model.named_buffers():
                value.copy_(getattr(self, key("model." + name))[k])
        return model

    def setup(self, stage: str) -> None:
        for part in self.parts:
            part.to(self.device)

    # -- one step ------------------------------------------------------------------------------

    def training_step(self, batch, batch_idx: int):
        inputs, tokens = [b for b, _ in batch], [t for _, t in batch]
        alive = [k for k in range(self.size) if self.diverged[k] is None]
        losses, terms = self.losses(inputs, alive)
        finite = torch.isfinite(losses.detach()).tolist()
        step, outputs = self.global_step + 1, [None] * self.size
        for i, k in enumerate(alive):
            if finite[i]:
                outputs[k] = {"loss": losses[i].detach(), "tokens": tokens[k], "flops": None,
                              "sequences": next(iter(inputs[k].values())).shape[0],
                              "terms": {name: value[i] for name, value in terms.items()}}
            else:
                self.diverged[k] = step  # its run ends here, as it would alone; the others go on
        kept = [i for i, ok in enumerate(finite) if ok]
        if not kept:
            self.trainer.should_stop = True
            return None
        total = losses.sum() if len(kept) == len(alive) else losses[kept].sum()
        return {"loss": total, "members": outputs}

    def losses(self, inputs: list[dict[str, torch.Tensor]], alive: list[int]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """Each alive member's training loss on its own batch, [len(alive)], with what its run
        records of the auxiliary terms (RunModule.loss: `task_loss` and each term, [len(alive)]
        each; none without terms)."""
        if self.rng_states is None:
            split = shared_and_batched([inputs[k] for k in alive])
            if split is not None and frozenset(split[1]) not in self.vmap_failed:
                try:
                    losses = self.vmapped(*split, alive)
                    self.vmap_steps += 1
                    return losses
                except RuntimeError as err:  # the model branches on a batched value (a mask that differs), or
                    if not any(limit in str(err).lower() for limit in VMAP_LIMITS):  # an op vmap cannot batch
                        raise
                    self.vmap_failed.add(frozenset(split[1]))
        each = [self.member_loss(k, inputs[k]) for k in alive]
        return torch.stack([loss for loss, _ in each]), {name: torch.stack([terms[name] for _, terms in each])
                                                         for name in each[0][1]}

    def vmapped(self, shared: dict[str, torch.Tensor], batched: dict[str, torch.Tensor],
                alive: list[int]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        params, buffers = self.member_params(alive)
        task, calls = self.tasks[alive[0]], self.parts[0]  # a task's loss is the same function for every seed

        def loss(p, b, rows):
            return with_terms(lambda: task.loss(Member(calls, self.aliases, {**p, **b}), {**shared, **rows}, self.family))

        return vmap(loss, in_dims=(0, 0, 0), randomness="error")(params, buffers, batched)

    def member_loss(self, k: int, inputs: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        params, buffers = self.member_params(None)
        member = Member(self.parts[0], self.aliases, {n: t[k] for n, t in {**params, **buffers}.items()})
        if self.rng_states is None:
            return with_terms(lambda: self.tasks[k].loss(member, inputs, self.family))
        with member_stream(self.rng_states, k, self.device):
            return with_terms(lambda: self.tasks[k].loss(member, inputs, self.family))

    # -- optimizer, schedule, clipping --------------------------------------------------------

    def configure_optimizers(self):
        """The run's optimizer, built by its variant over one member's model (its groups, in its
        order, as RunModule builds it), each parameter then replaced by its stack: an element-wise
        optimizer keeps no state before its first step, and updates each member's slice as alone."""
        cfg = self.train_cfg
        model = self.parts[1]
        optimizer = build_optimizer(cfg["optimizer"], model, lr=cfg["lr"], weight_decay=cfg["weight_decay"])
        stacks = {id(p): self.stacked[key("model." + name)] for name, p in model.named_parameters()}
        for group in optimizer.param_groups:
            group["params"] = [stacks[id(p)] for p in group["params"]]
        factor = functools.partial(lr_factor, warmup=cfg["warmup_steps"], total=cfg["steps"],
                                   schedule=cfg["schedule"], min_ratio=cfg["min_lr_ratio"])
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}

    def configure_gradient_clipping(self, optimizer, gradient_clip_val=None, gradient_clip_algorithm=None) -> None:
        """Each member's gradient clipped to `gradient_clip_val` by its own norm, as
        torch.nn.utils.clip_grad_norm_ clips a run's (over the optimizer's parameters in order)."""
        if gradient_clip_val is None:
            return
        grads = [p.grad for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
        norms = torch.stack([torch.linalg.vector_norm(g.flatten(1), dim=1) for g in grads], dim=1)  # [K, tensors]
        coef = (gradient_clip_val / (torch.linalg.vector_norm(norms, dim=1) + 1e-6)).clamp(max=1.0)
        for g in grads:
            g.mul_(coef.view(-1, *[1] * (g.dim() - 1)))


def with_terms(loss_of) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """A member's training loss and what its run records with it, as RunModule.loss: the task's
    loss plus the auxiliary terms its modules add, and then `task_loss` and each term (none
    without terms)."""
    with collect() as terms:
        loss = loss_of()
    if not terms:
        return loss, {}
    return loss + terms.total(), {"task_loss": loss.detach(), **terms.curves()}


class member_stream:
    """Member k's random state in place of the global one while it runs (its dropout draws), and
    back into its slot afterwards: each member draws what its run alone would draw."""

    def __init__(self, states: list[torch.Tensor], k: int, device: torch.device):
        self.states, self.k, self.cuda = states, k, device.type == "cuda"

    def __enter__(self):
        self.outer = stream_state(self.cuda)
        set_stream_state(self.states[self.k], self.cuda)

    def __exit__(self, *exc):
        self.states[self.k] = stream_state(self.cuda)
        set_stream_state(self.outer, self.cuda)


def stream_state(cuda: bool):
    return (torch.get_rng_state(), torch.cuda.get_rng_state() if cuda else None)


def set_stream_state(state, cuda: bool) -> None:
    torch.set_rng_state(state[0])
    if cuda:
        torch.cuda.set_rng_state(state[1])


def shared_and_batched(batches: list[dict[str, torch.Tensor]]):
    """A step's member batches as (values every member shares, values stacked per member), for
    vmap; None when their shapes differ (padded to different widths)."""
    shared, batched = {}, {}
    for name, first in batches[0].items():
        values = [b[name] for b in batches]
        if any(v.shape != first.shape for v in values):
            return None
        if all(torch.equal(first, v) for v in values[1:]):
            shared[name] = first
        else:
            batched[name] = torch.stack(values)
    return shared, batched


class MemberView:
    """What a member's RunRecorder reads of the module: the model (its own weights, loaded into
    the evaluation copy), no budget, the device."""

    budget_kind = None
    last_step = None

    def __init__(self, module: BatchedRunModule, k: int):
        self.module, self.k = module, k

    @property
    def model(self) -> nn.Module:
        return self.module.member_weights(self.k)

    @property
    def device(self) -> torch.device:
        return self.module.device


class BatchedRecorder(Callback):
    """Each member's RunRecorder and progress file, fed with its own share of the step's outputs."""

    def __init__(self, recorders: list[RunRecorder], progress: list[ProgressFile]):
        self.recorders, self.progress = recorders, progress
        self.module: BatchedRunModule | None = None
        self.restored: dict[str, Any] | None = None

    def on_train_start(self, trainer, pl_module) -> None:
        self.module = pl_module
        if self.restored is not None:  # a resumed run: each member's stream where it stopped, its divergence
            pl_module.rng_states, pl_module.diverged = self.restored["rng"], self.restored["diverged"]
        for recorder in self.recorders:
            recorder.on_train_start(trainer, pl_module)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        members = outputs["members"] if outputs else [None] * len(self.recorders)
        for k, (recorder, progress) in enumerate(zip(self.recorders, self.progress)):
            view = MemberView(pl_module, k)
            # as a run's own training step returns its call: here one step, taken or not
            member = {"steps": [{**members[k], "step": trainer.global_step}] if members[k] else []}
            recorder.on_train_batch_end(trainer, view, member, batch[k], batch_idx)
            progress.on_train_batch_end(trainer, view, member, batch[k], batch_idx)

    def state_dict(self) -> dict[str, Any]:
        rng = self.module.rng_states if self.module is not None else None
        return {"members": [r.state_dict() for r in self.recorders], "rng": rng,
                "diverged": self.module.diverged if self.module is not None else None}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for recorder, saved in zip(self.recorders, state["members"], strict=True):
            recorder.load_state_dict(saved)
        self.restored = {"rng": state["rng"], "diverged": state["diverged"]}


class BatchedData(pl.LightningDataModule):
    """Step i: every member's training batch i (each its own task's: its own data order)."""

    def __init__(self, tasks: Sequence[Any], family: str, batch_size: int, steps: int):
        super().__init__()
        self.sets = [StepBatches(task, batch_size, family, steps) for task in tasks]

    def train_dataloader(self):
        trainer = self.trainer
        sets = self.sets

        class Together(torch.utils.data.Dataset):
            def __len__(self):
                return len(sets[0])

            def __getitem__(self, index):
                return [s[index] for s in sets]

        sampler = StepSampler(len(sets[0]), lambda: trainer.global_step if trainer is not None else 0)
        return torch.utils.data.DataLoader(Together(), batch_size=None, sampler=sampler, generator=torch.Generator())

    def transfer_batch_to_device(self, batch, device: torch.device, dataloader_idx: int):
        if device.type == "cpu":
            return batch
        return super().transfer_batch_to_device(batch, device, dataloader_idx)


def batched_checkpoint(jobs: Sequence[Job]):
    """The checkpoint of a batched training: its own file for that set of runs, in the first's folder."""
    return (jobs[0].run_dir / LAST_CHECKPOINT).with_name(f"batched-{digest([j.run_id for j in jobs])}.ckpt")


def build_members(jobs: Sequence[Job], results: Sequence[RunResult], device: str, recorders: list[RunRecorder],
                  loggers: list[Any]):
    """Each member built as its run alone builds it, draws included, with its recorder and logger
    (appended to the caller's lists, so that a failure part way still closes the loggers opened);
    the members, their tasks, their random streams and the cost of one member's step."""
    members, tasks, rng = [], [], []
    for member, result in zip(jobs, results):
        train = member.config["train"]
        pl.seed_everything(member.config["seed"], workers=True, verbose=False)
        task = make_task(member.config)
        run_module = RunModule(member.config, task)
        result.n_params = run_module.model.num_parameters()
        batch = task.train_batch(0, train["batch_size"], run_module.family)
        cost = step_cost(run_module.model, lambda b, m=run_module, t=task: t.loss(m.model, b, m.family), batch)
        members.append(run_module), tasks.append(task), rng.append(stream_state(device == "cuda"))
        recorder = RunRecorder(task, run_module.family, train, cost,
                               [(make_task(s.config), s.config["train"]) for s in member.together])
        loggers.append(make_logger(train["logger"], member.run_dir, member.config, None))
        recorder.loggers = [loggers[-1]]
        recorders.append(recorder)
    return members, tasks, rng, cost


def batched_trainer(train: dict[str, Any], device: str, run_dir: Path, callbacks: list) -> pl.Trainer:
    """The Lightning Trainer of a batched training: one process, one device, no logger of its own
    (each member's logger is fed by its recorder)."""
    return pl.Trainer(
        max_steps=train["steps"], max_epochs=-1, limit_val_batches=0, num_sanity_val_steps=0,
        accelerator=train["accelerator"], devices=1, strategy=lightning_strategy(train),
        precision=train["precision"], gradient_clip_val=train["grad_clip"], deterministic=device == "cpu",
        logger=False, callbacks=callbacks, plugins=[SafeCheckpointIO()], enable_progress_bar=False,
        enable_model_summary=False, enable_checkpointing=False, default_root_dir=run_dir,
        use_distributed_sampler=False, profiler=NoProfiler())


def record_outcomes(results: Sequence[RunResult], recorders: Sequence[RunRecorder], step: int,
                    diverged: Sequence[int | None]) -> None:
    """How each member's fit ended: diverged at its own step, or finished with its last evaluation."""
    for result, recorder, diverged_step in zip(results, recorders, diverged):
        result.steps_done = step
        result.environment["processes"] = 1
        if diverged_step is not None:
            result.status, result.diverged_step, result.steps_done = Status.DIVERGED, diverged_step, diverged_step - 1
        else:
            result.status = Status.FINISHED
            result.metrics = recorder.last_eval["metrics"]
            result.not_applicable = recorder.last_eval["not_applicable"]


def train_batched(job: Job) -> list[RunResult]:
    """A job's seeds (the job and its `batch`, each with its evaluation siblings) trained as one
    batched model; one result per run, as each would have recorded trained alone."""
    if stopping.stop_requested():
        raise stopping.RunInterrupted("had not begun training")
    quiet_lightning()
    jobs = [job, *job.batch]
    start, cpu_start, share = time.perf_counter(), cpu_seconds(), torch.get_num_threads()
    for run in job.runs:
        start_run_folder(run.run_dir, run.config)
    train = job.config["train"]
    device = resolve_accelerator(train)
    memory = PeakMemory(on_cuda=device == "cuda")
    matmul, globals_before = matmul_precision(train, device), torch_globals()
    results = [RunResult(run_id=m.run_id, status=Status.FAILED, peak_memory_instrument=memory.instrument,
                         environment=run_environment(m.config, device, matmul)) for m in jobs]
    recorders: list[RunRecorder] = []
    loggers: list[Any] = []
    module = trainer = None
    try:
        torch.set_float32_matmul_precision(matmul)
        members, tasks, rng, cost = build_members(jobs, results, device, recorders, loggers)
        dropout = any(m.model.spec.dropout > 0 for m in members)
        module = BatchedRunModule(members, tasks, rng if dropout else None)
        if device == "cpu":  # the threads the K members' work together can keep busy
            torch.set_num_threads(run_threads(cost.flops * len(jobs), share))
        for result in results:
            result.environment.update(threads=torch.get_num_threads(), batched_with=len(jobs))
        ckpt = batched_checkpoint(jobs)
        ckpt.with_name(ckpt.name + ".tmp").unlink(missing_ok=True)
        callbacks = [BatchedRecorder(recorders, [ProgressFile(m.run_dir, train["steps"]) for m in jobs]),
                     Checkpoints(ckpt, train["checkpoint_every"]), memory]
        trainer = batched_trainer(train, device, job.run_dir, callbacks)
        data = BatchedData(tasks, module.family, train["batch_size"], train["steps"])
        trainer.fit(module, datamodule=data, ckpt_path=ckpt if ckpt.is_file() else None, weights_only=True)
        record_outcomes(results, recorders, trainer.global_step, module.diverged)
    except (stopping.RunInterrupted, SIGTERMException) as err:
        raise stopping.RunInterrupted(str(err) or "stopped") from None
    except (torch.OutOfMemoryError, MemoryError) as err:
        for result in results:
            result.status, result.error = Status.OOM, f"{type(err).__name__}: {err}".splitlines()[0]
    except Exception as err:  # the batch's outcome: every member's
        for result in results:
            record_error(result, err, job.run_dir if result is results[0] else None)
    finally:
        set_torch_globals(*globals_before)
        for logger, result in zip(loggers, results):
            close_tracker(logger, train["logger"], result)
    out: list[RunResult] = []
    wall, cpu = time.perf_counter() - start, cpu_seconds() - cpu_start
    for k, (member, result) in enumerate(zip(jobs, results)):
        if k < len(recorders):
            record_spending(result, recorders[k])
        result.peak_memory_bytes = memory.peak_bytes()
        out += [result, *(sibling_result(result, s, recorders[k].runs[i + 1] if k < len(recorders) else None)
                          for i, s in enumerate(member.together))]
    member_of = [k for k, member in enumerate(jobs) for _ in member.with_siblings]
    write_results(job.runs, out, wall, cpu / len(out),  # the batch's cost, shared by its runs
                  lambda i: (module.member_weights(member_of[i]), trainer.global_step))
    return out
