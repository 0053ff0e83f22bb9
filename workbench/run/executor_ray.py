"""Runs a sweep's runs as Ray tasks, one run per task, on a Ray cluster.

Ray schedules, places and retries; the workbench only submits. What the local executors
guarantee holds here too, because it lives in the runner (the driver): finished runs are
skipped, results are written to the store by the driver alone (workers return them), and an
interrupted run resumes from the checkpoint in its run folder. A task whose worker dies
(node lost, process killed) is retried by Ray up to `max_retries` times; the retry resumes
from the run's last checkpoint when the run folder is on storage the new worker can reach
(on a multi-node cluster: put the output folder or `--checkpoint-root` on shared storage).

The study's hardware needs are checked against the cluster (its GPUs, from `ray.nodes()`), not
against the driver, so a CPU head node can send GPU runs to GPU workers. Each task reserves
`--gpus-per-run` GPUs, by default what the run trains on: its `train.devices` when it trains on
a GPU of the cluster, none on the CPU. Ray shows a task only the GPUs it reserved.

A run over several nodes (`train.num_nodes` > 1) is placed by a Ray placement group with one
bundle per node (STRICT_SPREAD: each on a different node, reserved all at once); a task in each
bundle starts that node's ranks as Lightning's cluster recipe has it (workbench.run.distributed,
`NodeRank`), after a task on node 0 has chosen the rendezvous address. Node 0's result is the
run's; a node that fails has the others cancelled rather than left waiting in the rendezvous.
Such a run is not retried by Ray (one node alone cannot rejoin the others): it is recorded as
failed and resumes from its checkpoint when the study runs again. Its run folder must be on
storage every node reaches (`--runs-dir`): a node that cannot see it fails at once, saying so.

Connecting names the cause when it fails: nothing listening at --address, a cluster that
requires Ray's token authentication, or a Ray or Python version that differs from the cluster's
(`connection_error`).
"""

from __future__ import annotations

import json
import os
import re
import socket
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from workbench.errors import WorkbenchError
from workbench.hardware import Machine, gpus_per_run
from workbench.results import CONFIG_FILE, RunResult, Status, write_text_atomic
from workbench.run.distributed import NodeRank, train_in_processes
from workbench.run.executor import Executor, Job, execute

INSTALL_HINT = "pip install 'transformer-workbench[ray]'"
RENDEZVOUS_FILE = "rendezvous.json"  # node 0's address for this launch of a run over nodes: every node must read it
PROBE_S = 5.0  # --address: how long a TCP connection to the head may take before "nothing answers"


def import_ray():
    try:
        import ray
    except ModuleNotFoundError:
        raise WorkbenchError(f"--executor ray needs Ray, which is not installed: {INSTALL_HINT}") from None
    return ray


def execute_with_threads(job: Job, threads: int):
    import torch

    torch.set_num_threads(threads)  # Ray also sets OMP_NUM_THREADS to the task's CPUs
    return execute(job)


# ---- one run over several nodes ---------------------------------------------------------------


def choose_rendezvous(job: Job) -> tuple[str, int]:
    """On node 0: its IP address and a port free there, for the run's rendezvous; written to the
    run folder with the run's config, which every node reads (the folder must be shared)."""
    import ray

    with socket.socket() as probe:  # as Lightning picks a free port; rank 0 binds it moments later
        probe.bind(("", 0))
        port = probe.getsockname()[1]
    address = ray.util.get_node_ip_address()
    job.run_dir.mkdir(parents=True, exist_ok=True)
    write_text_atomic(job.run_dir / CONFIG_FILE, json.dumps(job.config, indent=2, sort_keys=True))
    write_text_atomic(job.run_dir / RENDEZVOUS_FILE, json.dumps({"address": address, "port": port}))
    return address, port


def train_node(job: Job, threads: int, rank: int, rendezvous: tuple[str, int]) -> RunResult | None:
    """On node `rank`: this node's ranks of the run (distributed.train_in_processes); node 0
    returns the run's result, another node None, or a failed result that says why."""
    import torch

    torch.set_num_threads(threads)
    address, port = rendezvous
    try:
        seen = json.loads((job.run_dir / RENDEZVOUS_FILE).read_text())
    except (OSError, ValueError):
        seen = None
    if seen != {"address": address, "port": port}:
        import ray

        return RunResult(job.run_id, Status.FAILED, error=(
            f"train.num_nodes: node {rank} ({ray.util.get_node_ip_address()}) does not see the run folder "
            f"{job.run_dir} that node 0 ({address}) wrote; put run folders on storage every node reaches "
            "(--runs-dir /shared/...)"))
    return train_in_processes(job.run_id, job.config, job.run_dir, job.tracker, NodeRank(rank, address, port))


@dataclass
class NodeGroup:
    """The tasks of one run over nodes, one per node, in their placement group."""

    job: Job
    placement: Any  # ray.util.placement_group.PlacementGroup
    tasks: list[Any]  # ObjectRef of each node's train_node, by node rank
    outcomes: dict[int, RunResult | None] = field(default_factory=dict)  # node rank -> what it returned
    failures: list[RunResult] = field(default_factory=list)  # in the order they came

    def result(self) -> RunResult:
        """Node 0's result; when it failed, the first failure to come, which caused the others."""
        result = self.outcomes.get(0)
        if result is not None and result.status != Status.FAILED:
            return result
        return self.failures[0] if self.failures else RunResult(self.job.run_id, Status.FAILED,
                                                                error="node 0 returned no result")


def nodes_with(ray, cpus: float, gpus: float) -> tuple[int, int]:
    """(alive nodes with at least `cpus` CPUs and `gpus` GPUs in all, alive nodes)."""
    alive = [node.get("Resources") or {} for node in ray.nodes() if node.get("Alive")]
    return sum(1 for r in alive if r.get("CPU", 0) >= cpus and r.get("GPU", 0) >= gpus), len(alive)


# ---- connecting ---------------------------------------------------------------------------------


def probe_address(address: str) -> None:
    """A WorkbenchError within PROBE_S when nothing accepts a TCP connection at HOST:PORT (Ray
    itself retries for minutes); other address forms (ray://, auto) are left to Ray."""
    match = re.fullmatch(r"\[?([^\[\]]+?)\]?:(\d+)", address)
    if match is None:
        return
    host, port = match.group(1), int(match.group(2))
    try:
        socket.create_connection((host, port), timeout=PROBE_S).close()
    except OSError as err:
        why = f"no answer within {PROBE_S:g} s" if isinstance(err, TimeoutError) else (err.strerror or str(err))
        raise WorkbenchError(
            f"--address: nothing answers at {address} ({why}); check HOST:PORT against what `ray start --head "
            "--port PORT` printed on the head, that the head is running (`ray status` there) and that the port is "
            "open from this machine, or omit --address for a private cluster on this machine") from None


def connection_error(address: str | None, err: BaseException) -> str:
    """What went wrong connecting to the Ray cluster at `address`, with the fix. Ray wraps the
    cause (its AuthenticationError, a version check's RuntimeError) in ConnectionErrors whose
    text may hold it only as a formatted traceback, so every exception in the chain is read."""
    chain, seen = [], err
    while seen is not None and len(chain) < 10:
        chain.append(seen)
        seen = seen.__cause__ or seen.__context__
    text = "\n".join(f"{type(e).__name__}: {e}" for e in chain)
    option, where = ("--address", f"the Ray cluster at {address}") if address else ("--executor ray", "a private Ray cluster")
    if "AuthenticationError" in text or "InvalidAuthToken" in text:
        return f"{option}: {where} requires Ray's token authentication and rejected this process: {auth_fix()}"
    versions = re.search(r"started with:\s+Ray: (\S+)\s+Python: (\S+)\s+This process.*?started with:\s+"
                         r"Ray: (\S+)\s+Python: (\S+)", text, re.S)
    if versions:
        ray_there, python_there, ray_here, python_here = versions.groups()
        return (f"{option}: {where} runs Ray {ray_there} on Python {python_there}, this environment Ray {ray_here} "
                f"on Python {python_here}; Ray connects only to the same versions: install ray=={ray_there} on "
                f"Python {python_there} here (or start the cluster from this environment)")
    last = str(chain[-1]).strip().splitlines()
    fix = ("check that it is running (`ray status` on the head) and that this is its address" if address else
           "Ray's own logs are in /tmp/ray/session_latest/logs")
    return f"{option}: cannot connect to {where} ({type(chain[-1]).__name__}: {last[-1] if last else ''}); {fix}"


def auth_fix() -> str:
    """How to give this process the cluster's token, for what is set here now."""
    token_file = Path(os.environ.get("RAY_AUTH_TOKEN_PATH") or Path.home() / ".ray" / "auth_token")
    has_token = bool(os.environ.get("RAY_AUTH_TOKEN")) or token_file.is_file()
    mode = os.environ.get("RAY_AUTH_MODE")
    if has_token and mode != "token":
        return (f"a token is here ({'RAY_AUTH_TOKEN' if os.environ.get('RAY_AUTH_TOKEN') else token_file}) but Ray "
                f"sends it to a named --address only with RAY_AUTH_MODE=token (now {mode or 'unset'}): export "
                "RAY_AUTH_MODE=token, and make sure it is the head's token (`ray get-auth-token` on the head prints it)")
    if has_token:
        return ("the token here is not the cluster's: copy the one `ray get-auth-token` prints on the head into "
                f"{token_file} (or export RAY_AUTH_TOKEN=...)")
    return ("this process has no token: run `ray get-auth-token` on the head, then here export RAY_AUTH_TOKEN=<it> "
            f"and RAY_AUTH_MODE=token (or put it in {token_file})")


class RayExecutor(Executor):
    """One Ray task per run, with `cpus` and `gpus` reserved for each (`gpus` None: what each
    run trains on, see the module docstring)."""

    def __init__(self, address: str | None = None, cpus: float = 1, gpus: float | None = None,
                 max_retries: int = 3, on_start=None):
        self.address, self.cpus, self.gpus = address, cpus, gpus
        self.cluster = address is not None
        self.max_retries = max_retries
        self.on_start = on_start
        self.started_here = False  # this executor started the (private) cluster, and stops it
        self._machine: Machine | None = None

    def _connect(self, ray) -> None:
        if ray.is_initialized():
            return
        if self.address is not None:
            probe_address(self.address)
        try:
            # No address: start a private single-machine cluster (and stop it afterwards).
            ray.init(address=self.address, include_dashboard=False, log_to_driver=False,
                     configure_logging=False)
            self.started_here = True
        except (ConnectionError, RuntimeError, ValueError, ray.exceptions.RayError) as err:
            raise WorkbenchError(connection_error(self.address, err)) from None

    def machine(self) -> Machine:
        """The cluster as one machine: CUDA when any node has a GPU, a run at most the GPUs of
        one node; bfloat16 is assumed (Ampere or newer), which only the worker can tell."""
        if self._machine is None:
            ray = import_ray()
            self._connect(ray)
            per_node = [int((node.get("Resources") or {}).get("GPU", 0)) for node in ray.nodes() if node.get("Alive")]
            total = sum(per_node)
            self._machine = (Machine("the Ray cluster", f"{total} GPUs, at most {max(per_node)} on one node, "
                                     "assumed Ampere or newer", cuda=True, bf16=True, gpu_count=max(per_node),
                                     cluster=self.cluster)
                             if total else Machine("the Ray cluster", "no GPU on any node", cluster=self.cluster))
        return self._machine

    def gpus_for(self, train: dict[str, Any]) -> float:
        """GPUs a run's task reserves: --gpus-per-run, else the GPUs it trains on in the cluster."""
        if self.gpus is not None:
            return self.gpus
        gpus = gpus_per_run(train, self.machine())
        if gpus is None:
            raise WorkbenchError(f"train.devices: {train['devices']!r} is not a number of GPUs, and a Ray task sees "
                                 "only the GPUs it reserves: set train.devices to a count, or give --gpus-per-run")
        return gpus

    def place(self, trains: Sequence[dict[str, Any]]) -> str:
        reserved = sorted({self.gpus_for(train) for train in trains})
        source = "--gpus-per-run" if self.gpus is not None else "train.devices of runs that train on a GPU"
        machine = self.machine()
        line = (f"ray: each run reserves {' or '.join(f'{g:g}' for g in reserved)} GPU(s) ({source}) and "
                f"{self.cpus:g} CPU(s); {machine.name}: {machine.description}")
        spread = sorted({train.get("num_nodes", 1) for train in trains if train.get("num_nodes", 1) > 1})
        for nodes in spread:
            self.check_nodes(nodes, max(self.gpus_for(t) for t in trains if t.get("num_nodes", 1) == nodes))
        if spread:
            line += f"; a run over {' or '.join(map(str, spread))} nodes reserves that on each of its nodes"
        return line

    def check_nodes(self, nodes: int, gpus: float) -> None:
        """A WorkbenchError now, not a rendezvous that waits for minutes, when the cluster has
        fewer than `nodes` nodes that could each hold one node's share of a run."""
        ray = import_ray()
        fit, alive = nodes_with(ray, self.cpus, gpus)
        if fit < nodes:
            where = f"the Ray cluster at {self.address}" if self.address else "the private Ray cluster on this machine"
            raise WorkbenchError(
                f"train.num_nodes: {nodes} nodes, each with {self.cpus:g} CPU(s) and {gpus:g} GPU(s) to reserve "
                f"(--cpus-per-run, --gpus-per-run), but {where} has {fit} such node(s) of {alive} alive; add nodes "
                "(`ray start --address HEAD:PORT` on each), lower the per-run reservation, or use num_nodes: 1")

    def run(self, jobs: Sequence[Job]) -> Iterator[Any]:
        ray = import_ray()
        self._connect(ray)
        remote = ray.remote(num_cpus=self.cpus, max_retries=self.max_retries)(execute_with_threads)
        threads = max(1, int(self.cpus))
        pending: dict[Any, tuple[Job, NodeGroup | None, int]] = {}  # task -> its job, run over nodes, node rank
        groups: list[NodeGroup] = []
        try:
            for job in jobs:
                if self.on_start:
                    self.on_start(job)
                if job.config["train"].get("num_nodes", 1) > 1:
                    group = self._launch_over_nodes(ray, job, threads)
                    groups.append(group)
                    pending.update({task: (job, group, rank) for rank, task in enumerate(group.tasks)})
                    continue
                task = remote.options(num_gpus=self.gpus_for(job.config["train"]))
                pending[task.remote(job, threads)] = (job, None, 0)
            while pending:
                done, _ = ray.wait(list(pending), num_returns=1)
                job, group, rank = pending.pop(done[0])
                try:
                    outcome = ray.get(done[0])
                except ray.exceptions.RayError as err:  # retries exhausted, or the task itself crashed
                    node = f"node {rank}: " if group is not None else ""
                    error = f"{node}ray: {type(err).__name__}: {err}".strip()[:2000]
                    outcome = job.failed(Status.FAILED, error) if group is None else RunResult(job.run_id, Status.FAILED,
                                                                                                error=error)
                if group is None:
                    yield from job.results(outcome)
                    continue
                group.outcomes[rank] = outcome
                if outcome is not None and outcome.status == Status.FAILED:
                    group.failures.append(outcome)
                    for task in group.tasks:  # the others would wait in the rendezvous, or in a collective
                        if task in pending:
                            ray.cancel(task)
                if len(group.outcomes) == len(group.tasks):
                    ray.util.remove_placement_group(group.placement)
                    groups.remove(group)
                    yield group.result()
        finally:
            for ref in pending:
                ray.cancel(ref, force=True)
            for group in groups:
                ray.util.remove_placement_group(group.placement)
            if self.started_here:
                ray.shutdown()
                self.started_here, self._machine = False, None

    def _launch_over_nodes(self, ray, job: Job, threads: int) -> NodeGroup:
        """The tasks of a run over `train.num_nodes` nodes: a placement group with one bundle per
        node, the rendezvous chosen on node 0, then one train_node task in each bundle."""
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        nodes, gpus = job.config["train"].get("num_nodes", 1), self.gpus_for(job.config["train"])
        bundle = {"CPU": self.cpus, **({"GPU": gpus} if gpus else {})}
        placement = ray.util.placement_group([bundle] * nodes, strategy="STRICT_SPREAD")

        def on_node(rank: int) -> PlacementGroupSchedulingStrategy:
            return PlacementGroupSchedulingStrategy(placement, placement_group_bundle_index=rank)

        rendezvous = ray.remote(num_cpus=0, max_retries=0)(choose_rendezvous).options(
            scheduling_strategy=on_node(0)).remote(job)
        train = ray.remote(max_retries=0)(train_node)
        tasks = [train.options(num_cpus=self.cpus, num_gpus=gpus, scheduling_strategy=on_node(rank))
                 .remote(job, threads, rank, rendezvous) for rank in range(nodes)]
        return NodeGroup(job, placement, tasks)
