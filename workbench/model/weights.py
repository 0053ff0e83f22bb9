"""What a finished run leaves for its readers (reports, `workbench compare`): its final weights
and the task it trained on, loaded without Lightning and without running code.

final.safetensors holds the trained weights (safetensors: no pickle) with the resolved run
config and the step as metadata; run folders written before that hold final.pt, loaded with
`weights_only=True` (tensors and plain data only).

A report ships the weights its pictures load in float16 (`write_shipped_weights`: half the bytes
of the repository's reports), and its pictures are drawn from the weights at that precision
(`load_pictured_model`) whether they are read from a run folder or from the shipped data, so a
report and its rebuild from the data draw the same pixels. Rounding a weight to float16 moves it by
at most 2^-11 of itself, far below what an attention map or a position picture shows.
"""

from __future__ import annotations

import json
import math
import os
import pickle
from pathlib import Path
from typing import Any

import safetensors
import safetensors.torch
import torch
from pydantic import BaseModel, ConfigDict, ValidationError
from torch.overrides import TorchFunctionMode

from workbench.errors import WorkbenchError
from workbench.model.transformer import Transformer, build_model
from workbench.registry import get_variant
from workbench.results import FINAL_WEIGHTS, OLD_FINAL_WEIGHTS, check_regular


class DamagedFile(WorkbenchError):
    """A file in a run folder that cannot (or must not) be loaded."""


def refuse_or_explain(path: Path, err: Exception, what_to_do: str) -> DamagedFile:
    """One line naming the file, what is wrong with it and what to do."""
    if isinstance(err, pickle.UnpicklingError) and "weights only" in str(err).lower():
        problem = ("holds Python objects that would run code when loaded (refused: only tensors and plain "
                   "data are loaded from run folders)")
    else:
        problem = f"is damaged or not a checkpoint ({type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''})"
    return DamagedFile(f"{path} {problem}; {what_to_do}")


def make_task(config: dict[str, Any]):
    spec = dict(config["task"])
    cls = get_variant("task", spec.pop("name"))
    # A tuning run's config says split "validation": it evaluates on the validation sets.
    return cls(cls.Params.model_validate(spec), seed=config["seed"], split=config.get("split", "eval"))


def save_final_weights(model: torch.nn.Module, config: dict[str, Any], step: int, path: Path) -> None:
    """The trained weights as safetensors (no pickle), the run config and step as metadata;
    written atomically. save_model keeps one copy of tied tensors."""
    tmp = path.with_name(path.name + ".tmp")
    safetensors.torch.save_model(model, str(tmp), metadata={"config": json.dumps(config), "step": str(step)})
    os.replace(tmp, path)


def shipped_precision(tensor: torch.Tensor) -> torch.Tensor:
    """`tensor` as a report ships it: a float32 tensor in float16 when every value stays finite
    there, any other tensor as it is."""
    if tensor.dtype != torch.float32:
        return tensor
    half = tensor.to(torch.float16)
    return half if bool(torch.isfinite(half).all()) else tensor


def write_shipped_weights(source: Path, target: Path) -> bool:
    """The final weights file `source` (a regular file, checked by the caller) written to the new
    file `target` at shipped precision, its metadata (run config, step) kept, its header in one
    order (`sort_header`); False, with nothing written, when it is at that precision already
    (shipped data: the caller copies its bytes)."""
    with safetensors.safe_open(str(source), framework="pt") as f:
        metadata = f.metadata()
        stored = {name: f.get_tensor(name) for name in f.keys()}
    shipped = {name: shipped_precision(tensor) for name, tensor in stored.items()}
    if all(shipped[name] is tensor for name, tensor in stored.items()):
        return False
    safetensors.torch.save_file(shipped, str(target), metadata=metadata)
    sort_header(target)
    return True


def sort_header(path: Path) -> None:
    """Rewrite the JSON header of the safetensors file `path` (written by this process) with its
    keys sorted, at the same length: safetensors writes its maps in an order that changes from one
    process to the next, so each re-issue of a report shipped the same tensors as new bytes (a new
    blob in git every time). The format's header is an 8-byte little-endian size, then that many
    bytes of JSON padded with spaces; the tensors' offsets are in it, so their order is free."""
    with open(path, "r+b") as f:
        size = int.from_bytes(f.read(8), "little")
        text = json.dumps(json.loads(f.read(size)), separators=(",", ":"), sort_keys=True, ensure_ascii=False).encode()
        if len(text) <= size:  # the writer's own JSON is compact: the same length, reordered
            f.seek(8)
            f.write(text.ljust(size, b" "))


def load_pictured_model(run_dir: str | Path) -> tuple[Transformer, dict[str, Any]]:
    """load_final_model, its weights rounded to shipped precision (idempotent: weights read from
    shipped data come back unchanged)."""
    model, config = load_final_model(run_dir)
    with torch.no_grad():
        for tensor in model.state_dict().values():  # these share storage with the model's own
            tensor.copy_(shipped_precision(tensor))
    return model, config


class SkipInitialisers(TorchFunctionMode):
    """torch.nn.init's functions return their tensor untouched. For models built on the meta
    device, which holds no values to fill: torch's meta `normal_` loads its compiler first (about
    a second of CPU, once per process), and a report only wants the parameter count there."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if getattr(func, "__module__", None) == torch.nn.init.__name__:
            return args[0] if args else kwargs["tensor"]
        return func(*args, **(kwargs or {}))


def load_final_model(run_dir: str | Path) -> tuple[Transformer, dict[str, Any]]:
    """The trained model of a finished run (eval mode) and its resolved run config.
    Raises FileNotFoundError without final weights and DamagedFile for a file that is not
    what the workbench writes (truncated, or a pickle with code in it)."""
    path = Path(run_dir) / FINAL_WEIGHTS
    old = Path(run_dir) / OLD_FINAL_WEIGHTS
    redo = "report without pictures (`workbench report --no-pictures`) or retrain (`workbench run --fresh`)"
    if not check_regular(path) and check_regular(old):  # a link or FIFO planted there is refused, never waited on
        try:
            saved = torch.load(old, map_location="cpu", weights_only=True)
            model = build_model(saved["config"]["model"])
            model.load_state_dict(saved["state_dict"])
        except Exception as err:
            raise refuse_or_explain(old, err, redo) from None
        return model.eval(), saved["config"]
    if not check_regular(path):
        raise FileNotFoundError(path)
    try:
        with safetensors.safe_open(str(path), framework="pt") as f:
            try:
                config = StoredConfig.model_validate_json(f.metadata()["config"]).model_dump()
            except ValidationError as err:
                problem = err.errors()[0]
                raise ValueError(f"its stored config: {'.'.join(map(str, problem['loc']))}: {problem['msg']}") from None
            stored = sum(math.prod(f.get_slice(name).get_shape()) for name in f.keys())
        with torch.device("meta"), SkipInitialisers():  # counted before anything is allocated
            wanted = build_model(config["model"]).num_parameters()
        if wanted > stored:
            raise ValueError(f"its stored config asks for a model of {wanted:.3g} parameters, the file holds {stored:.3g}")
        model = build_model(config["model"])
        safetensors.torch.load_model(model, str(path), device="cpu")
    except Exception as err:
        raise refuse_or_explain(path, err, redo) from None
    return model.eval(), config


def refuse_non_finite(model: torch.nn.Module, path: str | Path,
                      redo: str = "retrain the run (`workbench run --fresh`) or use another run") -> None:
    """DamagedFile naming the first tensor of the weights at `path` that holds NaN or an
    infinity: a finished run never saves one (a diverging run stops before it), so the file was
    damaged or edited, and nothing may generate from it or receive it as a model."""
    for name, tensor in model.state_dict().items():
        if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
            raise DamagedFile(f"{path}: {name} holds NaN or infinite values, which no finished run saves; {redo}")


class StoredConfig(BaseModel):
    """The run config in a weights file's metadata, checked before a model is built from it."""

    model_config = ConfigDict(extra="allow")
    model: dict[str, Any]
    task: dict[str, Any]
    seed: int = 0
