"""One run over several processes: Lightning's DDP (and its other multi-process strategies).

Lightning's `ddp` strategy starts ranks 1..N-1 by running the command line of rank 0 again.
Run from `workbench run`, that would start the whole sweep again in every rank (and meet the
folder's writer lock). So a run that needs several processes trains in a child process of its
own, `python -m workbench.run.one_run RUN_DIR RUN_ID`, which reads the run's config.json and
trains that one run; Lightning re-launches exactly that command for the other ranks.

    worker: train_run -> train_in_processes -> child (rank 0) ----- ranks 1.. (Lightning)
                         waits, forwards a stop,    trains, writes       train, write nothing
                         reads result.json          result.json

Only rank 0 writes (result.json, final weights, progress, logs; Lightning writes checkpoints
from rank 0). The child runs in a process group of its own: a stop request reaches its ranks
from the worker (SIGTERM to rank 0, which has every rank stop at the same step, checkpoint it
and end), never from the terminal directly, and a group that does not end in STOP_GRACE_S is killed (a rank stuck in
the rendezvous cannot run a signal handler).

A run over several nodes (`train.num_nodes` > 1) follows Lightning's recipe for a cluster it
does not manage: the same command on every node, with MASTER_ADDR and MASTER_PORT (node 0's
address) and NODE_RANK set, which Lightning's LightningEnvironment reads; each node's process
starts that node's other devices' ranks itself. The Ray executor starts one such command per node
(workbench.run.executor_ray) and hands each its `NodeRank`; rank 0 of node 0 writes as above.

A rank that never joins (a node that is not there, a port that is blocked) would keep the others
waiting in the rendezvous for PyTorch's default of 30 minutes: RENDEZVOUS_TIMEOUT ends that wait
(`lightning_strategy`), the run fails with the reason, and the sweep goes on.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch

from workbench import stopping
from workbench.hardware import device_count
from workbench.results import CONFIG_FILE, RESULT_FILE, RunResult, Status, write_text_atomic
from workbench.study.train_section import world_size

LOG_FILE = "distributed.log"  # the ranks' stdout and stderr
POLL_S = 0.5
STOP_GRACE_S = 60.0  # after SIGTERM, time for the ranks to checkpoint before the group is killed
RENDEZVOUS_TIMEOUT = timedelta(minutes=2)


def needs_processes(train: dict[str, Any]) -> bool:
    """True when the run may train on several processes (several devices or nodes, or a count
    left to Lightning): then it trains in a child process of its own."""
    size = world_size(train)
    return size is None or size > 1


def rank_zero() -> bool:
    """This process is rank 0 of its run (ranks > 0 are started by Lightning with these set)."""
    return os.environ.get("LOCAL_RANK", "0") == "0" and os.environ.get("NODE_RANK", "0") == "0"


def shard(batch: dict[str, Any], rank: int, world: int) -> dict[str, Any]:
    """Rank `rank`'s contiguous share of the rows of every tensor of a batch: the ranks together
    train on the same batch a single process would, so a step's global batch is unchanged."""
    return {key: value.tensor_split(world)[rank] for key, value in batch.items()}


@dataclass(frozen=True)
class NodeRank:
    """One node's place in a run over several nodes: its rank and the rendezvous on node 0."""

    rank: int
    main_address: str  # node 0's IP address
    main_port: int  # a port free on node 0, where rank 0 serves the rendezvous

    def env(self) -> dict[str, str]:
        """The variables Lightning's LightningEnvironment reads, in this node's every rank."""
        return {"MASTER_ADDR": self.main_address, "MASTER_PORT": str(self.main_port), "NODE_RANK": str(self.rank)}


def cluster_environment(train: dict[str, Any]) -> list[Any]:
    """Lightning's LightningEnvironment, named, for a run over nodes started with `NodeRank.env`:
    without it, variables a Ray worker inherits from the cluster's own scheduler (SLURM's, say)
    would make Lightning read ranks from that scheduler instead. Nothing for other runs."""
    if train["num_nodes"] > 1 and "NODE_RANK" in os.environ:
        from lightning_fabric.plugins.environments import LightningEnvironment

        return [LightningEnvironment()]
    return []


def train_in_processes(run_id: str, config: dict[str, Any], run_dir: Path, tracker: Any = None,
                       node: NodeRank | None = None) -> RunResult | None:
    """Train the run in a child process group (see the module docstring); its result.json is
    the result. `tracker` (workbench.run.tracking.TrackerRun) travels as JSON. A stop request (workbench.stopping) is forwarded as SIGTERM and ends in
    RunInterrupted once the ranks have checkpointed. `node`: this node's share of a run over
    several nodes; a node other than node 0 writes nothing and returns None when its ranks
    ended cleanly, else a failed result that says why."""
    writer = node is None or node.rank == 0
    run_dir.mkdir(parents=True, exist_ok=True)
    result_path = run_dir / RESULT_FILE
    if writer:  # atomically: another node's ranks may be reading it
        write_text_atomic(run_dir / CONFIG_FILE, json.dumps(config, indent=2, sort_keys=True))
        result_path.unlink(missing_ok=True)
    env = dict(os.environ)  # the worker's thread share, split between this node's ranks
    local_ranks = (world_size(config["train"]) or 1) // config["train"]["num_nodes"]
    env["OMP_NUM_THREADS"] = str(max(1, torch.get_num_threads() // max(1, local_ranks)))
    if node is not None:
        env.update(node.env())
    log_path = run_dir / (LOG_FILE if writer else f"distributed-node{node.rank}.log")
    with open(log_path, "ab") as log:
        tracker_arg = [json.dumps(dataclasses.asdict(tracker))] if tracker is not None else []
        child = subprocess.Popen([sys.executable, "-m", "workbench.run.one_run", str(run_dir), run_id, *tracker_arg],
                                 stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                 env=env, start_new_session=True)
        stopped_at = None
        try:
            while child.poll() is None:
                if stopped_at is None and stopping.stop_requested():
                    stopped_at = time.monotonic()
                    # rank 0 alone: it tells the others at the end of the step (train.Checkpoints), so every
                    # rank stops at the same step; a signal to each could end one inside a collective
                    os.kill(child.pid, signal.SIGTERM)
                elif stopped_at is not None and time.monotonic() - stopped_at > STOP_GRACE_S:
                    _signal_group(child.pid, signal.SIGKILL)
                time.sleep(POLL_S)
        finally:  # ranks left behind by a rank 0 that died, or by this wait cut short (a cancelled Ray task)
            _signal_group(child.pid, signal.SIGKILL)
    if stopped_at is not None:  # the checkpoint holds the run; a result written on the way out is no outcome
        if writer:
            result_path.unlink(missing_ok=True)
        raise stopping.RunInterrupted("stopped")
    if not writer:
        return None if child.returncode == 0 else RunResult(run_id, Status.FAILED, error=(
            f"node {node.rank}: its processes ended ({_exit_reason(child.returncode)}); "
            f"see {log_path}: {_last_line(log_path)}"))
    if result_path.exists():
        return RunResult.from_json(json.loads(result_path.read_text()))
    return RunResult(run_id, Status.FAILED, error=(
        f"its processes ended ({_exit_reason(child.returncode)}) without a result; "
        f"see {log_path}: {_last_line(log_path)}"))


def _signal_group(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)
    except ProcessLookupError:
        pass


def _exit_reason(code: int) -> str:
    return f"killed by signal {-code}" if code < 0 else f"exit code {code}"


def _last_line(path: Path) -> str:
    try:
        lines = path.read_text(errors="replace").strip().splitlines()
    except OSError:
        return "(no log)"
    return lines[-1][:300] if lines else "(empty log)"


def lightning_strategy(train: dict[str, Any]) -> Any:
    """`train.strategy` as Lightning takes it: a DDP strategy (named, or the one "auto" picks for
    more than one process) built with RENDEZVOUS_TIMEOUT; any other name as it is."""
    from pytorch_lightning.strategies import DDPStrategy, StrategyRegistry

    name = train["strategy"]
    if name == "auto" and (device_count(train["devices"]) > 1 or train.get("num_nodes", 1) > 1):
        name = "ddp"  # what "auto" picks for several processes outside a notebook
    entry = StrategyRegistry.get(name) if name in StrategyRegistry else None
    if entry is None or not isinstance(entry, DDPStrategy):
        return train["strategy"]
    return DDPStrategy(**StrategyRegistry[name]["init_params"], timeout=RENDEZVOUS_TIMEOUT)

