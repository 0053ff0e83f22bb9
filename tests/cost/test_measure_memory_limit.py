"""A measuring process bounds its memory with the instrument that fits its device: an
address-space cap on the CPU, PyTorch's allocator cap on CUDA, where the driver maps far more
virtual memory than it allocates (an address-space cap there would record every point "oom").
The CUDA branch is exercised on the CPU with the CUDA calls faked."""

from __future__ import annotations

import multiprocessing
import resource
import types

import pytest
import torch
from conftest import HANG_GUARD_S

from workbench.cost import measure
from workbench.cost.measure import limit_memory
from workbench.cost.workload import Point

TINY = {"vocab_size": 32, "d_model": 16, "n_heads": 4, "n_layers": 2, "position": "none"}
GPU_MEMORY = 80 * 2**30


def fake_cuda(monkeypatch) -> list[tuple[float, torch.device]]:
    """An 80 GiB CUDA device; returns the memory fractions set on it."""
    fractions = []
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: types.SimpleNamespace(total_memory=GPU_MEMORY))
    monkeypatch.setattr(torch.cuda, "set_per_process_memory_fraction",
                        lambda fraction, device: fractions.append((fraction, device)))
    return fractions


def test_cuda_caps_the_allocator_and_never_the_address_space(monkeypatch):
    fractions, limits = fake_cuda(monkeypatch), []
    monkeypatch.setattr(measure.resource, "setrlimit", lambda *args: limits.append(args))
    assert limit_memory(Point(model=TINY, length=16, device="cuda", memory_limit_gb=10)) == "cuda_memory_fraction"
    assert fractions == [(10 / 80, torch.device("cuda"))] and limits == []
    assert limit_memory(Point(model=TINY, length=16, device="cuda:0", memory_limit_gb=200)) == "cuda_memory_fraction"
    assert fractions[-1][0] == 1.0  # a limit above the device's memory: the whole device
    assert limits == []


def test_the_cpu_caps_the_address_space_above_what_the_process_holds(monkeypatch):
    fractions, limits = fake_cuda(monkeypatch), []
    monkeypatch.setattr(measure.resource, "setrlimit", lambda *args: limits.append(args))
    assert limit_memory(Point(model=TINY, length=16, memory_limit_gb=1)) == "address_space"
    (which, (soft, _)), = limits
    assert which == resource.RLIMIT_AS and soft >= 2**30 and fractions == []
    assert limit_memory(Point(model=TINY, length=16, device="cuda")) is None  # no limit asked: nothing set
    assert len(limits) == 1 and fractions == []


def limits_in_a_child(results) -> None:
    """In a fresh process: the address-space limit after a (faked) CUDA point's cap, then after a
    CPU point's."""
    torch.cuda.get_device_properties = lambda device: types.SimpleNamespace(total_memory=GPU_MEMORY)
    torch.cuda.set_per_process_memory_fraction = lambda fraction, device: None
    limit_memory(Point(model=TINY, length=16, device="cuda", memory_limit_gb=1))
    after_cuda = resource.getrlimit(resource.RLIMIT_AS)[0]
    limit_memory(Point(model=TINY, length=16, device="cpu", memory_limit_gb=1))
    results.put((after_cuda, resource.getrlimit(resource.RLIMIT_AS)[0]))


@pytest.mark.slow
def test_a_measuring_process_on_cuda_keeps_an_unlimited_address_space():
    if resource.getrlimit(resource.RLIMIT_AS)[0] != resource.RLIM_INFINITY:
        pytest.skip("this test process already has an address-space limit")
    context = multiprocessing.get_context("spawn")
    results = context.Queue()
    child = context.Process(target=limits_in_a_child, args=(results,))
    child.start()
    after_cuda, after_cpu = results.get(timeout=HANG_GUARD_S)
    child.join(timeout=HANG_GUARD_S)
    assert after_cuda == resource.RLIM_INFINITY
    assert after_cpu != resource.RLIM_INFINITY  # the same process, a CPU point: capped
