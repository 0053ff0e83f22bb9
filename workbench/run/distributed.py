"""One run across several processes (Lightning's `devices` > 1 or `num_nodes` > 1): the
strategy, with a rendezvous that cannot hang a sweep.

A DDP rank that never joins (a node that is not there, a port that is blocked) would keep the
others waiting in the rendezvous for PyTorch's default of 30 minutes, deaf to signals while
they wait. RENDEZVOUS_TIMEOUT ends that wait: the run fails with the reason, the sweep goes on.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from workbench.hardware import device_count

RENDEZVOUS_TIMEOUT = timedelta(minutes=2)


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

