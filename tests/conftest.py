"""Shared helpers for model tests: tiny specs, family-aware forward calls, incremental decoding;
and for tests that start processes: CPU-time budgets in place of wall-clock limits.

Every model helper works for any registered variant, so tests parametrized over the registry
(`registered(axis)`) cover a new plugin without new code here.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
import types
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import Tensor

from workbench import build_model, hookimpl, registry
from workbench.errors import SpecError
from workbench.model.cache import KVCache
from workbench.model.mixer import TokenMixer
from workbench.model.transformer import EncoderDecoderModel, Positions, Transformer
from workbench.registry import variants
from workbench.tasks.tokens import DATA_DIR_ENV
from workbench.variants import MODEL_AXES



@pytest.fixture(autouse=True, scope="session")
def token_shards_in_a_temporary_folder(tmp_path_factory):
    """Tests (and the runs they spawn) never write token shards under the user's ~/.cache."""
    os.environ[DATA_DIR_ENV] = str(tmp_path_factory.mktemp("token-shards"))


FAMILIES = ("encoder", "decoder", "encoder_decoder")
GENERATIVE = ("decoder", "encoder_decoder")

# Test models are tiny: one intra-op thread is fastest, and on a loaded machine (pytest -n 2
# on 2 cores) extra threads spin against each other and make a 40 ms generation take 1 s.
torch.set_num_threads(1)
VOCAB = 32

# Small enough that a model builds and runs in milliseconds; 4 heads so that GQA (2) and
# MQA (1) are both distinct from MHA.
TINY: dict[str, Any] = dict(vocab_size=VOCAB, d_model=16, n_layers=1, n_heads=4, dropout=0.0)

# Parameters that make a variant do something visible at n <= 16 (its defaults may be sized
# for real sequences, e.g. a 256-token window that would equal full attention here).
# Variants not listed run with their defaults.
TINY_PARAMS: dict[tuple[str, str], dict[str, Any]] = {
    ("attention", "sliding_window"): {"window": 3},
    ("attention", "chunked"): {"chunk": 5},
    ("attention", "sparse"): {"block": 2, "n_global_blocks": 1, "n_random_blocks": 1},
    ("position", "learned"): {"max_len": 64},
    ("position", "nope_temperature"): {"floor_scale": 2, "attn_scale": 0.5},
}


def registered(axis: str) -> list[str]:
    """Names registered for an axis, in a stable order (for parametrize)."""
    return sorted(variants(axis))


def registered_kernels() -> list[str]:
    """The attention variants that are kernels (q, k, v in; workbench.model.attention), not whole
    token mixers (workbench.model.mixer): what kernel-level tests call directly."""
    return [name for name in registered("attention") if not issubclass(variants("attention")[name], TokenMixer)]


def build_or_refuse(spec: dict[str, Any], seed: int = 0) -> Transformer | None:
    """The model, or None when the combination is refused with a SpecError naming a model field
    (a variant that cannot take it: differential attention with an odd number of K/V heads). A
    refusal that names no field, or any other error, fails the test."""
    try:
        return build(spec, seed)
    except SpecError as err:
        assert err.field.startswith("model."), f"a refusal that names no model field: {err}"
        return None


def choice(axis: str, name: str) -> dict[str, Any]:
    """A variant mapping with the tiny-size parameters of TINY_PARAMS, where the variant has
    those parameters (so an unrelated plugin reusing a name is not handed foreign keys)."""
    if name not in variants(axis):
        return {"name": name}  # left for the spec to reject
    known = variants(axis)[name].Params.model_fields
    params = {k: v for k, v in TINY_PARAMS.get((axis, name), {}).items() if k in known}
    return {"name": name, **params}


def tiny_spec(family: str = "decoder", **overrides: Any) -> dict[str, Any]:
    """A tiny model spec; variant axes given as names get their TINY_PARAMS. A residual
    connection defined with one norm placement (DeepNorm: post) gets it unless `norm` is given."""
    spec = dict(TINY, family=family, position="rope", attention="full", norm="pre", ffn="gelu", residual="plain")
    residual = overrides.get("residual", "plain")
    needed = getattr(variants("residual").get(residual if isinstance(residual, str) else residual["name"]),
                     "norm_placement", None)
    if needed is not None and "norm" not in overrides:
        spec["norm"] = needed
    spec.update(overrides)
    for axis in MODEL_AXES:
        if isinstance(spec[axis], str):
            spec[axis] = choice(axis, spec[axis])
    return spec


def build(spec: dict[str, Any], seed: int = 0) -> Transformer:
    """Build in eval mode (no dropout) with a fixed seed, so two builds have equal weights."""
    torch.manual_seed(seed)
    return build_model(spec).eval()


def tokens(B: int, n: int, seed: int = 0, low: int = 2) -> Tensor:
    """Random ids in [low, VOCAB): 0 stays free for padding and 1 for BOS."""
    g = torch.Generator().manual_seed(seed)
    return torch.randint(low, VOCAB, (B, n), generator=g)


def logits_of(model: Transformer, x: Tensor, tgt: Tensor | None = None, **masks: Tensor | None) -> Tensor:
    """Family-aware forward: encoder/decoder read x; encoder_decoder reads source x and
    target tgt (x itself when tgt is None)."""
    if isinstance(model, EncoderDecoderModel):
        return model(x, x if tgt is None else tgt, **masks)
    return model(x, **masks)


def incremental_logits(model: Transformer, target: Tensor, prefill: int = 1, src: Tensor | None = None,
                       src_padding_mask: Tensor | None = None) -> Tensor:
    """Logits for every position of `target` [B, n], computed as generation does: the first
    `prefill` tokens in one pass through an empty KV cache, then one token per step reading
    the cache. The cache has the capacity generation gives it (a sliding window keeps only
    its last `window` positions), so ring-buffer wrap-around is exercised too."""
    B, n = target.shape
    stack = model.decoder
    memory = memory_seq = None
    cross = 0
    if isinstance(model, EncoderDecoderModel):
        memory, memory_seq = model.encode(src, src_padding_mask)
        cross = src.shape[1]
    cache = KVCache(len(stack.blocks), n, cross)
    pos = torch.arange(n).expand(B, n)
    out = [model.logits(stack(target[:, :prefill], Positions(pos[:, :prefill], None), memory, memory_seq, cache))]
    for t in range(prefill, n):
        out.append(model.logits(stack(target[:, t : t + 1], Positions(pos[:, t : t + 1], None), memory,
                                    memory_seq, cache)))
    return torch.cat(out, dim=1)  # [B, n, vocab]


def generate(model: Transformer, x: Tensor, max_new_tokens: int, use_cache: bool, **kw: Any) -> Tensor:
    return model.generate(x, max_new_tokens=max_new_tokens, strategy="greedy", use_cache=use_cache, **kw)


def check_causal(model: Transformer) -> None:
    """P6, causality: changing the target tokens after position t leaves every logit up to t as it
    was (to float tolerance), and changes the logits at t + 1 (else the check proves nothing)."""
    src, x, t = tokens(2, 7, seed=5), tokens(2, 12), 6
    y = x.clone()
    y[:, t + 1 :] = tokens(2, 12 - t - 1, seed=9)
    with torch.no_grad():
        a, b = (logits_of(model, src, z) if isinstance(model, EncoderDecoderModel) else model(z) for z in (x, y))
    torch.testing.assert_close(b[:, : t + 1], a[:, : t + 1], atol=1e-5, rtol=1e-5)
    assert (b[:, t + 1] - a[:, t + 1]).abs().max() > 1e-4, "the perturbation had no effect: the check would prove nothing"


def check_greedy_decoding(model: Transformer, x: Tensor, max_new_tokens: int) -> None:
    """Greedy generation with cache == without cache == argmax of the teacher-forced forward
    on the generated sequence (each new token is the argmax at the position before it)."""
    cached = generate(model, x, max_new_tokens, use_cache=True)
    uncached = generate(model, x, max_new_tokens, use_cache=False)
    assert torch.equal(cached, uncached), f"cached {cached.tolist()} != uncached {uncached.tolist()}"
    with torch.no_grad():
        if isinstance(model, EncoderDecoderModel):
            teacher = model(x, cached[:, :-1])  # target starts with BOS
            new = cached[:, 1:]
        else:
            teacher = model(cached[:, :-1])
            new = cached[:, x.shape[1] :]
    predicted = teacher[:, -max_new_tokens:].argmax(-1)
    assert torch.equal(predicted, new), f"teacher-forced argmax {predicted.tolist()} != generated {new.tolist()}"


def train_step(model: Transformer, x: Tensor, lr: float = 1e-2) -> float:
    """One AdamW step on next-token (or, for the encoder, same-token) cross-entropy; returns
    the loss. Asserts the loss, every gradient and every updated parameter are finite."""
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    logits = logits_of(model, x)
    if model.spec.family == "encoder":
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), x.flatten())
    else:
        loss = torch.nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1), x[:, 1:].flatten())
    loss.backward()
    assert torch.isfinite(loss), loss
    for name, p in model.named_parameters():
        if p.grad is not None:
            assert torch.isfinite(p.grad).all(), f"non-finite gradient in {name}"
    opt.step()
    for name, p in model.named_parameters():
        assert torch.isfinite(p).all(), f"non-finite parameter {name} after one step"
    model.eval()
    return loss.item()


@contextmanager
def installed_plugin(name: str, **hooks: list[type]) -> Iterator[types.ModuleType]:
    """A module `name` whose hooks (e.g. register_position_schemes=[MyScheme]) are registered
    with the plugin manager, as if installed; unregistered on exit unless the test already did."""
    module = types.ModuleType(name)
    for hook, classes in hooks.items():
        setattr(module, hook, hookimpl(lambda classes=classes: classes))
    pm = registry.plugin_manager()
    pm.register(module)
    registry.variants.cache_clear()
    try:
        yield module
    finally:
        if pm.is_registered(module):
            pm.unregister(module)
        registry.variants.cache_clear()


# ---- processes held to CPU budgets, not wall-clock limits -------------------------------------
# Under load (load average 25-30 on 2 cores, pytest -n 2 beside other work) a process gets a
# fifteenth of a core, so its wall time measures the neighbours and a wall-clock limit fails a
# correct test. What a test holds a process to is the CPU time it spends, which load barely
# moves; the wall clock only guards against a hang, so it is generous: HANG_GUARD_S for what a
# quiet machine does in seconds, and WALL_PER_CPU_S more per CPU second a process may spend
# (a twentieth of a core: 2 cores at a load average of 40).
HANG_GUARD_S = 1800.0
WALL_PER_CPU_S = 20
LEAVE_S = 300.0  # how long processes get to be gone after a stop: a loaded machine runs their exit late
POLL_S = 0.05


def cpu_so_far(pid: int) -> float:
    """CPU seconds of a running process and of the children it has waited for (/proc/PID/stat
    fields 14-17); 0 where there is no /proc, so only the check at its end applies."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return sum(int(f) for f in fields[11:15]) / os.sysconf("SC_CLK_TCK")


def kill_and_reap(proc: subprocess.Popen) -> None:
    """SIGKILL to `proc`, and to its process group where it leads one (its workers)."""
    if os.getpgid(proc.pid) == proc.pid:
        os.killpg(proc.pid, signal.SIGKILL)
    else:
        proc.kill()
    os.wait4(proc.pid, 0)
    proc.returncode = -signal.SIGKILL


def wait_within_cpu(proc: subprocess.Popen, cpu_budget_s: float) -> subprocess.CompletedProcess:
    """Wait for `proc` to end, reading its pipes, and fail the test if it spends more than
    `cpu_budget_s` seconds of CPU (its own and that of the children it waited for: wait4's
    rusage at its end, /proc while it runs, when it is killed at once) or is still running after
    the hang guard. The result carries its output as subprocess.run's does."""
    output: dict[str, str | bytes] = {}
    readers = [threading.Thread(target=lambda name=name, pipe=pipe: output.__setitem__(name, pipe.read()), daemon=True)
               for name, pipe in (("stdout", proc.stdout), ("stderr", proc.stderr)) if pipe is not None]
    for reader in readers:
        reader.start()
    guard_s = HANG_GUARD_S + WALL_PER_CPU_S * cpu_budget_s
    deadline = time.monotonic() + guard_s
    while not (ended := os.wait4(proc.pid, os.WNOHANG))[0]:
        if (spent := cpu_so_far(proc.pid)) > cpu_budget_s:
            kill_and_reap(proc)
            pytest.fail(f"{proc.args}: {spent:.1f} s of CPU and still running, over its budget of "
                        f"{cpu_budget_s:g} s: killed")
        if time.monotonic() > deadline:
            kill_and_reap(proc)
            pytest.fail(f"{proc.args}: still running after {guard_s:g} s of wall time (a hang): killed")
        time.sleep(POLL_S)
    _, status, usage = ended
    proc.returncode = os.waitstatus_to_exitcode(status)  # reaped here: Popen must not wait for it again
    for reader in readers:  # EOF once every process holding the pipes has ended
        reader.join(max(0.0, deadline - time.monotonic()))
        assert not reader.is_alive(), f"{proc.args}: ended, but a process it started still holds its output open"
    for pipe in (proc.stdout, proc.stderr):
        if pipe is not None:
            pipe.close()
    done = subprocess.CompletedProcess(proc.args, proc.returncode, output.get("stdout"), output.get("stderr"))
    cpu_s = usage.ru_utime + usage.ru_stime
    tail = f"{done.stdout or ''}{done.stderr or ''}"[-2000:]
    assert cpu_s <= cpu_budget_s, (f"{proc.args}: {cpu_s:.1f} s of CPU, over its budget of {cpu_budget_s:g} s "
                                   f"(exit status {proc.returncode}); its output ends:\n{tail}")
    return done


def run_within_cpu(args: Sequence[str], cpu_budget_s: float, *, check: bool = False,
                   **popen: Any) -> subprocess.CompletedProcess:
    """subprocess.run(args, capture_output=True, check=check, **popen), held to a CPU budget
    (`wait_within_cpu`) instead of a wall-clock timeout."""
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, **popen)
    done = wait_within_cpu(proc, cpu_budget_s)
    if check:
        done.check_returncode()
    return done
