"""What a study's settings need from the machine that runs them, decided in one place.

    Machine.here()          this machine, as PyTorch sees it (CUDA, bfloat16, MPS, GPU count)
    Machine.target("cuda")  a machine named on the command line (`workbench validate --device`)
    train_needs / scaling_needs   the settings a machine cannot run, as `Need`s
    gpus_per_run            the GPUs one run takes on a machine (executors place runs by it)
    run_threads             the torch threads one CPU run trains with, within its share of the cores

`workbench run` refuses the first need this machine lacks, before anything trains
(`Need.error`). `workbench validate` checks everything else about the study and lists the needs
this machine lacks as notes (`Need.note`), so a GPU profile validates on a CPU-only laptop; with
`--device` it checks against the named machine instead, and a need that machine lacks is an error.
A cluster executor checks `run` against its cluster instead of this machine (Executor.machine).
Processes no machine of this kind can host (`devices` over its cores or GPUs, `num_nodes` > 1
without a named cluster) are `unservable`: `validate` refuses them too.
"""

from __future__ import annotations

import os
import resource
from dataclasses import dataclass
from typing import Any

import torch


@dataclass(frozen=True)
class Machine:
    """The hardware a study is checked against."""

    name: str  # how messages refer to it: "this machine", "a --device cuda machine"
    description: str  # what it has, for notes: "CPU only", "CUDA: NVIDIA H200 x1"
    cuda: bool = False
    mps: bool = False
    bf16: bool = False  # its CUDA GPU computes in bfloat16 (Ampere or newer)
    gpu_count: int | None = None  # GPUs one run can use (a cluster: the most on one node); None: not known
    cpus: int | None = None  # CPU cores; None: not known (a named target)
    cluster: bool = False  # runs go to a named cluster (Ray --address): devices and nodes are its to serve

    @classmethod
    def here(cls, cluster: bool = False) -> Machine:
        cpus = os.cpu_count()
        if torch.cuda.is_available():
            count = torch.cuda.device_count()
            return cls("this machine", f"CUDA: {torch.cuda.get_device_name()} x{count}", cuda=True,
                       bf16=torch.cuda.is_bf16_supported(), gpu_count=count, cpus=cpus, cluster=cluster)
        if torch.backends.mps.is_available():
            return cls("this machine", "Apple MPS", mps=True, cpus=cpus, cluster=cluster)
        return cls("this machine", "CPU only", cpus=cpus, cluster=cluster)

    @classmethod
    def target(cls, device: str, cluster: bool = False) -> Machine:
        """A machine with `device` ('cpu', 'cuda', 'mps'); a CUDA target is assumed to have
        bfloat16 (Ampere or newer) and enough GPUs, which only the machine itself can tell."""
        name = f"a --device {device} machine"
        if device == "cuda":
            return cls(name, "a CUDA GPU, assumed Ampere or newer", cuda=True, bf16=True, cluster=cluster)
        if device == "mps":
            return cls(name, "Apple MPS", mps=True, cluster=cluster)
        return cls(name, "CPU only", cluster=cluster)

    def device_for(self, accelerator: str) -> str:
        """'cuda', 'mps', 'cpu' (or 'tpu') that Lightning's `accelerator` picks on this machine;
        a GPU asked for by name is 'cuda' even where there is none (`train_needs` says so)."""
        if accelerator == "auto":
            return "cuda" if self.cuda else "mps" if self.mps else "cpu"
        return "cuda" if accelerator in ("gpu", "cuda") else accelerator


@dataclass(frozen=True)
class Need:
    """A setting that needs hardware a machine lacks."""

    field: str  # dotted study key: "train.precision"
    value: Any  # its value: "bf16-mixed"
    needs: str  # what it needs: "a GPU"
    problem: str  # why, naming the machine: "runs on a GPU; this machine trains on the CPU, ..."
    fix: str  # what to change in the study to run there: 'set precision: "32"'
    unservable: bool = False  # no profile fixes it here (processes this machine cannot host): `validate` refuses

    def note(self, machine: Machine) -> str:
        """`workbench validate`'s line: the study is fine, this machine cannot run it."""
        return (f"needs {self.needs}: {self.field} {self.value!r} ({machine.name}: {machine.description}); "
                "`workbench run` here would refuse")

    def error(self, source: str | None, machine: Machine) -> str:
        """The refusal, with advice that fits where the setting came from: `source` is the
        option that set it ("--profile gpu", "--set KEY=VALUE"), None for the study file."""
        if source is None:
            advice = (f"{self.fix}, or put the setting in a profile, e.g. profiles: {{gpu: {{{self.field}: "
                      f"{self.value}}}}}, and run with --profile gpu on a machine with {self.needs}")
        else:
            advice = (f"it comes from {source}, for a machine with {self.needs}: run it on one, or leave {source} "
                      f"out on {machine.name}")
        return f"{self.field}: {self.value!r} {self.problem} ({advice})"


def device_count(devices: int | str) -> int:
    """How many devices `train.devices` names: 2 for 2 or "0,1"; 1 for "auto" and -1 (all),
    whose count only the machine that runs them knows."""
    if isinstance(devices, int):
        return max(devices, 1)
    if "," in devices or devices.strip().isdigit():
        parts = [p for p in devices.split(",") if p.strip()]
        return len(parts) if "," in devices else max(int(devices), 1)
    return 1


def train_needs(train: dict[str, Any], machine: Machine) -> list[Need]:
    """The needs of one `train:` section (accelerator, precision, devices) that `machine` lacks."""
    accelerator, precision, devices = train["accelerator"], train["precision"], train["devices"]
    device = machine.device_for(accelerator)
    needs = []
    if device == "cuda" and not machine.cuda:
        needs.append(Need("train.accelerator", accelerator, "a CUDA GPU",
                          f"asks for a CUDA GPU; PyTorch sees none on {machine.name}", "use accelerator: auto or cpu"))
    if device == "mps" and not machine.mps:
        needs.append(Need("train.accelerator", accelerator, "Apple MPS",
                          f"asks for Apple's MPS; {machine.name} has none", "use accelerator: auto or cpu"))
    if precision != "32" and device == "cpu":
        needs.append(Need("train.precision", precision, "a GPU",
                          f"runs on a GPU; {machine.name} trains on the CPU, where only '32' is supported",
                          'set precision: "32"'))
    if precision == "bf16-mixed" and device == "cuda" and machine.cuda and not machine.bf16:
        needs.append(Need("train.precision", precision, "a GPU with bfloat16 (Ampere or newer)",
                          f"needs bfloat16 support (Ampere or newer); {machine.name} ({machine.description}) lacks it",
                          "use '16-mixed' or '32'"))
    if machine.cluster:  # the cluster serves devices and nodes; only it can tell how many it has
        return needs
    count, nodes = device_count(devices), train.get("num_nodes", 1)
    if device == "cuda" and machine.gpu_count is not None and count > machine.gpu_count:
        needs.append(Need("train.devices", devices, f"{count} GPUs",
                          f"GPUs per run; {machine.name} has {machine.gpu_count}", f"use devices: {machine.gpu_count} or -1",
                          unservable=machine.cuda))
    if device == "cpu" and machine.cpus is not None and count > machine.cpus:
        needs.append(Need("train.devices", devices, f"{count} CPU processes per run",
                          f"asks for {count} CPU processes per run; {machine.name} has {machine.cpus} cores",
                          f"use devices: {machine.cpus} or fewer", unservable=True))
    if nodes > 1:
        needs.append(Need("train.num_nodes", nodes, f"a cluster of {nodes} nodes",
                          f"spreads each run over {nodes} machines; {machine.name} is one and no cluster was named, "
                          "so the rendezvous would wait for nodes that never come",
                          "use num_nodes: 1, or run on a Ray cluster of that many nodes (--executor ray --address HOST:PORT), "
                          "which starts each node's ranks", unservable=True))
    return needs


def gpus_per_run(train: dict[str, Any], machine: Machine) -> int | None:
    """The GPUs one run with this `train:` section takes on `machine`: 0 when it trains on the
    CPU (or MPS), its `devices` count on CUDA; None when `devices` is not a count ('auto' and -1
    take every GPU the run sees; '0,1' names GPUs)."""
    if machine.device_for(train["accelerator"]) != "cuda":
        return 0
    devices = train["devices"]
    return devices if isinstance(devices, int) and devices >= 1 else None


def scaling_needs(device: str, machine: Machine) -> list[Need]:
    """The need of a scaling study's `scaling.device` that `machine` lacks."""
    if device == "cuda" and not machine.cuda:
        return [Need("scaling.device", device, "a CUDA GPU",
                     f"measures on a CUDA GPU; PyTorch sees none on {machine.name}", "use device: auto or cpu")]
    return []


# Training FLOPs per step that each torch thread of a CPU run must have to do: below that, the
# threads of a model's operations mostly wait for one another instead of computing. On a shared
# 2-core machine a second thread never paid from 0.53 to 65.5 GFLOP per step (2.1x to 18x the
# CPU, and slower), so a second thread starts past every size measured: at 100 GFLOP per step.
# Measured, alternated in one process: benchmarks/README.md, "Threads per run".
FLOPS_PER_THREAD = 5e10


def run_threads(step_flops: float, share: int) -> int:
    """The torch threads a CPU run trains with: one per FLOPS_PER_THREAD of its training step's
    FLOPs, at least one and at most `share`, the threads its executor gives each run (the
    process's torch threads: cores // --jobs in a worker, all of them in-process, a Ray task's CPUs)."""
    return max(1, min(share, int(step_flops // FLOPS_PER_THREAD)))


def cpu_seconds() -> float:
    """CPU time (user + system) of this process and of its children that have ended: a run's or
    a measurement's cost in CPU, which a busy machine does not inflate as it does wall time."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def machine_load() -> dict[str, Any]:
    """The 1-minute load average and the core count when a run or measurement ends: a load above
    the cores means other work competed for them, so its timings are those of a shared machine."""
    try:
        load = round(os.getloadavg()[0], 2)
    except OSError:  # not available on this platform
        load = None
    return {"load_1m": load, "cores": os.cpu_count()}
