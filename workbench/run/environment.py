"""What a run trains on and with: the device and float32 matmul precision it uses, the versions
it records, and the checks, before anything trains, that this machine (or a cluster's) and the
installed packages give what the study's `train:` section asks for (workbench.hardware)."""

from __future__ import annotations

import functools
import importlib
import inspect
import platform
from collections.abc import Callable
from importlib.metadata import PackageNotFoundError, version
from typing import TYPE_CHECKING, Any

import torch

from workbench.errors import WorkbenchError
from workbench.hardware import Machine, train_needs
from workbench.registry import get_variant
from workbench.results import git_commit
from workbench.run.tracking import check_logger

if TYPE_CHECKING:
    from pytorch_lightning.callbacks import Callback


@functools.cache
def environment(device: str) -> dict[str, Any]:
    """Versions and device a run trained with (the same for every run of a process; its torch
    threads are the run's own, workbench.hardware.run_threads)."""
    import pytorch_lightning as pl  # loaded by the training process already; the driver never needs it

    try:
        project = version("transformer-workbench")
    except PackageNotFoundError:
        project = None
    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "lightning": pl.__version__,
        "device": device,
        "cpu": platform.processor() or platform.machine(),
        "workbench": project,
        "git_commit": git_commit(),
    }


def resolve_accelerator(train: dict[str, Any]) -> str:
    """'cuda', 'mps' or 'cpu' that the study's accelerator setting picks on this machine."""
    return Machine.here().device_for(train["accelerator"])


def matmul_precision(train: dict[str, Any], device: str) -> str:
    """torch's float32 matmul precision a run trains with: the study's `train.matmul_precision`
    on CUDA ('high': TF32 on Ampere or newer), full float32 ('highest') elsewhere."""
    return train["matmul_precision"] if device == "cuda" else "highest"


def check_device(train: dict[str, Any], source_of: Callable[[str], str | None] = lambda key: None,
                 machine: Machine | None = None) -> str:
    """The device the runs will use; a WorkbenchError, before anything trains, when a setting
    needs hardware `machine` (default: this one; a cluster's for a cluster executor) lacks
    (workbench.hardware) or the chosen logger is not installed. `source_of(key)` names the
    option that set a key (StudyFile.source_of), for the advice."""
    machine = machine or Machine.here()
    needs = train_needs(train, machine)
    if needs:
        raise WorkbenchError(needs[0].error(source_of(needs[0].field), machine))
    check_packages(train)
    return machine.device_for(train["accelerator"])


def check_packages(train: dict[str, Any]) -> None:
    """A WorkbenchError, before anything trains, when a setting needs code that is not there: the
    logger's package, the optimizer's (Lion's), or a `train.callbacks` class that does not import or does
    not take its arguments."""
    check_logger(train)
    optimizer = get_variant("optimizer", train["optimizer"]["name"], "train.optimizer")
    missing = optimizer(optimizer.Params.model_validate(
        {k: v for k, v in train["optimizer"].items() if k != "name"})).missing()
    if missing:
        raise WorkbenchError(f"train.optimizer: {missing}")
    for i, spec in enumerate(train["callbacks"]):
        cls = import_callback(spec["path"], f"train.callbacks.{i}")
        try:
            inspect.signature(cls).bind(**spec["args"])
        except TypeError as err:
            raise WorkbenchError(f"train.callbacks.{i}: {spec['path']} does not take the arguments "
                                 f"{sorted(spec['args'])}: {err}") from None


def import_callback(path: str, field: str) -> type[Callback]:
    """The Lightning callback class at an import path the study wrote (`package.module.Class` or
    `package.module:Class`). Importing runs that module's code, as `pip install` of it would."""
    from pytorch_lightning.callbacks import Callback  # only a study with callbacks needs Lightning here

    module_name, _, name = path.replace(":", ".").rpartition(".")
    try:
        module = importlib.import_module(module_name)
    except ImportError as err:
        raise WorkbenchError(f"{field}: cannot import {module_name!r} ({err}); give the import path of a class "
                             "in an installed package, e.g. pytorch_lightning.callbacks.LearningRateMonitor") from None
    cls = getattr(module, name, None)
    if not (isinstance(cls, type) and issubclass(cls, Callback)):
        raise WorkbenchError(f"{field}: {path!r} is not a pytorch_lightning Callback class "
                             "(a subclass of pytorch_lightning.callbacks.Callback)")
    return cls


def user_callbacks(train: dict[str, Any]) -> list[Callback]:
    return [import_callback(spec["path"], f"train.callbacks.{i}")(**spec["args"])
            for i, spec in enumerate(train["callbacks"])]


def device_name(device: str) -> str:
    if device == "cuda":
        return f"cuda: {torch.cuda.get_device_name()}"
    return device if device != "cpu" else f"cpu: {platform.processor() or platform.machine()}"
