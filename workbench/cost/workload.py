"""What one measurement builds: a `Point` (model spec, scope, mode, length) and its `Workload`,
a module and a zero-argument call that runs the measured computation once.

Scopes:  attention  the attention variant alone on given q, k, v (no projections)
         layer      one self-attention layer: QKV projection, position rotation,
                    attention, output projection
         block      one Transformer block: the layer above, norms and the FFN
         model      the whole model of the spec (embedding, every block, LM head)
Modes:   forward    inference forward (no autograd graph)
         train_step forward + backward of the output's sum (parameter and input grads)
         decode     one generated token at context `length`, with or without the KV
                    cache (scope model, decoder family); without the cache the model
                    recomputes the whole context but, like nanoGPT's generate, applies the
                    LM head to the last position only
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

import torch
from pydantic import BaseModel, ConfigDict, Field
from torch import Tensor, nn

from workbench.model.cache import KVCache
from workbench.model.flex import arange_positions
from workbench.errors import SpecError
from workbench.model.mixer import Layer, TokenMixer
from workbench.model.residual import Depth
from workbench.model.transformer import Block, DecoderModel, Positions, build_model, make_mixer, position_scheme
from workbench.model.spec import ModelSpec, parse_spec


Scope = Literal["attention", "layer", "block", "model"]
Mode = Literal["forward", "train_step", "decode"]
DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


class Point(BaseModel):
    """One measurement: what to build, at which size, in which mode."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    model: dict[str, Any] = Field(description="model spec mapping (as a study's `model:` section)")
    scope: Scope = "layer"
    mode: Mode = "forward"
    length: int = Field(gt=0, description="sequence length; for decode, the context length")
    batch_size: int = Field(1, gt=0)
    kv_cache: bool | None = Field(None, description="decode only: read past K/V from the cache")
    warmup: int = Field(1, ge=0, description="untimed calls before the timed ones")
    repeats: int = Field(5, gt=0, description="timed calls")
    seed: int = Field(0, description="seed of the parameters and inputs")
    device: str = "cpu"
    dtype: Literal["float32", "float16", "bfloat16"] = "float32"
    threads: int | None = Field(None, gt=0, description="torch CPU threads (None: torch's default)")
    memory_limit_gb: float | None = Field(
        None, gt=0, description="cap on the point's memory (isolated runs only): its address-space growth on "
        "the CPU, what PyTorch's caching allocator may reserve on CUDA"
    )


@dataclass
class Workload:
    """A built module and a zero-argument call that runs the measured computation once."""

    root: nn.Module
    run: Callable[[], None]
    backward_factor: int = 1  # analytic FLOPs: forward only (1) or forward + backward (3)
    kv_cache_bytes: int | None = None
    kv_cache_bytes_formula: int | None = None
    notes: dict[str, Any] = field(default_factory=dict)


def _causal(spec: ModelSpec) -> bool:
    return spec.family != "encoder"


def _inputs_and_module(spec: ModelSpec, scope: Scope, n: int, B: int, device, dtype):
    """(module, forward callable taking nothing and returning the output tensor)."""
    causal = _causal(spec)
    seq = Positions(arange_positions(B, n, device), None)
    if scope == "attention":
        attention = spec.uniform("attention", "a scaling study's attention scope")
        if issubclass(attention.cls, TokenMixer):
            raise SpecError("model.attention", f"{attention.name} is a token mixer, not a kernel on q, k and v: measure "
                            "it at scope layer, block or model")
        module = attention.cls(attention.params, n_heads=spec.n_heads, n_kv_heads=spec.n_kv_heads,
                               head_dim=spec.head_dim)
        q = torch.randn(B, spec.n_heads, n, spec.head_dim, device=device, dtype=dtype, requires_grad=True)
        k, v = (torch.randn(B, spec.n_kv_heads, n, spec.head_dim, device=device, dtype=dtype,
                            requires_grad=True) for _ in range(2))
        return module.to(device), lambda: module(q, k, v, q_pos=seq.pos, k_pos=seq.pos, key_mask=None,
                                                 causal=causal, score_bias=None)
    if scope in ("layer", "block"):
        position = position_scheme(spec, spec.uniform("position", f"a scaling study's {scope} scope"), causal)
        layer = Layer(0, Depth.of(spec, in_decoder=causal))
        module = make_mixer(spec, layer, position) if scope == "layer" else Block(
            spec, position, causal, cross=False, layer=layer)
        module = module.to(device=device, dtype=dtype)
        x = torch.randn(B, n, spec.d_model, device=device, dtype=dtype, requires_grad=True)
        if scope == "layer":
            return module, lambda: module(x, seq, causal)
        return module, lambda: module(x, seq)
    model = build_model(spec).to(device=device, dtype=dtype)
    tokens = torch.randint(spec.vocab_size, (B, n), device=device)
    if spec.family == "encoder_decoder":
        return model, lambda: model(tokens, tokens)
    return model, lambda: model(tokens)


class NextTokenLogits(nn.Module):
    """The decoding step of a decoder model as one module, so that the FLOP counter names its
    parts from one root: the blocks over the new tokens, then the LM head on the last
    position only (as nanoGPT's generate; the head over the whole context is not decoding)."""

    def __init__(self, model: DecoderModel):
        super().__init__()
        self.model = model

    def forward(self, tokens: Tensor, seq: Positions, cache: KVCache | None) -> Tensor:
        return self.model.logits(self.model.decoder(tokens, seq, cache=cache)[:, -1])  # [B, vocab]


def _decode_workload(spec: ModelSpec, point: Point, device, dtype) -> Workload:
    """One new token at context `length`: with the cache, a single-token step against the
    cached K/V of the prefilled context; without it, a forward over context + 1 tokens."""
    if point.scope != "model" or spec.family != "decoder":
        raise ValueError(f"decode measures a decoder model at scope 'model' (got scope {point.scope!r}, "
                         f"family {spec.family!r})")
    model = build_model(spec).to(device=device, dtype=dtype).eval()
    B, L = point.batch_size, point.length
    n_layers = len(model.decoder.blocks)
    logits = NextTokenLogits(model)

    if not point.kv_cache:
        tokens = torch.randint(spec.vocab_size, (B, L + 1), device=device)
        seq = Positions.of(tokens, None)
        return Workload(logits, torch.no_grad()(lambda: logits(tokens, seq, None)))

    # Every call appends one token: room for all calls measure_point makes (warm-up, peak,
    # RSS, FLOPs, repeats). The context thus grows from L to at most L + calls during measurement.
    calls = point.warmup + point.repeats + 6
    cache = KVCache(n_layers, L + calls)
    prompt = torch.randint(spec.vocab_size, (B, L), device=device)
    with torch.no_grad():
        logits(prompt, Positions.of(prompt, None), cache)
    element = torch.empty((), dtype=dtype).element_size()
    formula = sum(block.attn.cache_bytes(L, B, element) for block in model.decoder.blocks)
    measured = cache.nbytes  # after the prompt: exactly what the context left in each layer's cache
    next_pos = [L]

    @torch.no_grad()
    def step() -> None:
        token = torch.randint(spec.vocab_size, (B, 1), device=device)
        logits(token, Positions(torch.full((B, 1), next_pos[0], device=device), None), cache)
        next_pos[0] += 1

    return Workload(logits, step, kv_cache_bytes=measured, kv_cache_bytes_formula=formula)


def parameters_of(module: nn.Module) -> list[Tensor]:
    # Not module.parameters(): on variant classes the Variant mixin's `parameters()` (the
    # listing of declared Params) shadows nn.Module's.
    return [p for _, p in module.named_parameters()]


def build_workload(point: Point) -> Workload:
    spec = parse_spec(point.model)
    device, dtype = torch.device(point.device), DTYPES[point.dtype]
    torch.manual_seed(point.seed)
    if point.mode == "decode":
        return _decode_workload(spec, point, device, dtype)
    module, forward = _inputs_and_module(spec, point.scope, point.length, point.batch_size, device, dtype)
    if point.mode == "forward":
        module.eval()

        @torch.no_grad()
        def infer() -> None:
            forward()

        return Workload(module, infer)
    module.train()
    params = parameters_of(module)

    def train_step() -> None:
        for p in params:
            p.grad = None  # free last step's grads first: their memory is not this step's
        forward().float().sum().backward()

    # Backward of attention: grads of scores, of v, of q and of k: twice the forward's work.
    return Workload(module, train_step, backward_factor=3)
