"""The workbench's DecoderModel side by side with x-transformers at the same architecture.

Both models are built from one workbench spec; `xtransformers_kwargs` maps the spec onto
x-transformers' options, and `align_xtransformers` changes the two layers x-transformers has
no option for. Parameter counts are checked (`parameter_check`), so a mapping mistake shows
as a count mismatch instead of as a flattering speed-up.

    workbench spec                  x-transformers
    d_model / n_layers / n_heads    dim / depth / heads, attn_dim_head = head_dim
    n_kv_heads (GQA, MQA)           attn_kv_heads
    position: rope                  rotary_pos_emb=True, rotary_emb_dim=head_dim
                                    (its default rotates only half of each head)
    position: alibi                 alibi_pos_bias=True (same slopes, Press et al.)
    position: sinusoidal            scaled_sinu_pos_emb=True: the one difference left,
                                    +1 parameter (a learned gain on the table, initialised to
                                    d_model^-0.5) and sin | cos halves instead of interleaved
    position: none                  use_abs_pos_emb=False
    norm: pre / post                pre_norm=True / False (post: no final norm, as ours)
    norm type: rmsnorm              use_rmsnorm=True, norm_add_unit_offset=False
    norm type: layernorm            its bias-less LayerNorm, swapped for nn.LayerNorm (with
                                    bias, as ours) by align_xtransformers
    ffn: relu / gelu                ff_custom_activation=nn.ReLU() / default nn.GELU,
                                    ff_mult = d_ff / d_model, ff_no_bias = not bias
    ffn: swiglu / geglu             ff_glu=True (+ ff_swish=True for SwiGLU); its GLU input
                                    projection always has a bias: removed by align_xtransformers
    attention: full                 attn_flash=True (PyTorch SDPA, its fast path)
    attention: sliding_window w     attn_max_attend_past=w-1: a mask over the full n x n scores
                                    (x-transformers has no blocked local attention)
    bias=False                      its attention projections have no bias (no option)
    tie_embeddings=True             tie_embedding=True, tie_embedding_scale=1 (default d^-0.5)
    dropout 0                       all its dropouts default to 0
"""

from __future__ import annotations

import importlib.util
import statistics
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from workbench import build_model
from workbench.model.spec import ModelSpec, parse_spec

# The four decoder-only architectures, at d_model 256, 4 layers, 4 heads, vocab 256.
BASE = dict(family="decoder", vocab_size=256, d_model=256, n_layers=4, n_heads=4)
CONFIGS: dict[str, dict[str, Any]] = {
    "a: rope+swiglu+pre-rms": dict(BASE, position="rope", ffn="swiglu", norm={"name": "pre", "type": "rmsnorm"}),
    "b: alibi+gelu+pre-ln": dict(BASE, position="alibi", ffn="gelu", norm={"name": "pre", "type": "layernorm"}),
    "c: sinus+relu+post-ln": dict(BASE, position="sinusoidal", ffn="relu", norm={"name": "post", "type": "layernorm"}),
    "d: gqa(kv=1)+rope": dict(BASE, position="rope", ffn="swiglu", norm={"name": "pre", "type": "rmsnorm"},
                              n_kv_heads=1),
}


def xtransformers_available() -> bool:
    return importlib.util.find_spec("x_transformers") is not None


def d_ff_of(spec: ModelSpec) -> int:
    """The FFN hidden width the workbench uses for this spec (see workbench/model/ffn.py)."""
    gated = spec.ffn.name in ("swiglu", "geglu")
    return spec.ffn.params.d_ff or (round(8 * spec.d_model / 3) if gated else 4 * spec.d_model)


def xtransformers_kwargs(spec: ModelSpec) -> dict[str, Any]:
    """x-transformers Decoder options for the architecture of `spec` (table in the module doc)."""
    if spec.family != "decoder":
        raise ValueError("the comparison covers decoder-only models")
    if spec.bias:
        raise ValueError("x-transformers' attention projections have no bias: compare with bias=False")
    if spec.tie_qk or spec.dropout:
        raise ValueError("tie_qk and dropout have no x-transformers counterpart in this comparison")
    head_dim = spec.head_dim
    kw: dict[str, Any] = dict(
        dim=spec.d_model, depth=spec.n_layers, heads=spec.n_heads, attn_dim_head=head_dim,
        attn_kv_heads=spec.n_kv_heads, attn_flash=True, pre_norm=spec.norm.name == "pre",
        norm_add_unit_offset=False, ff_mult=d_ff_of(spec) / spec.d_model,
        ff_no_bias=True, verbose=False,
    )
    position = spec.position.name
    if position == "rope":
        kw.update(rotary_pos_emb=True, rotary_emb_dim=head_dim)
    elif position == "alibi":
        kw.update(alibi_pos_bias=True)
    elif position not in ("sinusoidal", "none"):
        raise ValueError(f"no x-transformers mapping for position {position!r}")
    if spec.norm.params.type == "rmsnorm":
        kw.update(use_rmsnorm=True)
    ffn = spec.ffn.name
    if ffn in ("swiglu", "geglu"):
        kw.update(ff_glu=True, ff_swish=ffn == "swiglu")
    elif ffn == "relu":
        kw.update(ff_custom_activation=nn.ReLU())
    elif ffn != "gelu":
        raise ValueError(f"no x-transformers mapping for ffn {ffn!r}")
    attention = spec.attention.name
    if attention == "sliding_window":
        # Ours reads the last `window` positions (offsets 0..w-1); theirs masks offsets > max_attend_past.
        kw.update(attn_max_attend_past=spec.attention.params.window - 1)
    elif attention != "full":
        raise ValueError(f"no x-transformers mapping for attention {attention!r}")
    return kw


def align_xtransformers(model: nn.Module, spec: ModelSpec) -> nn.Module:
    """Change the two layers x-transformers cannot configure to the workbench's architecture:
    the GLU input projection's bias (always on there) and the bias-less LayerNorm."""
    import x_transformers.x_transformers as xt

    for module in model.modules():
        if isinstance(module, xt.GLU) and not spec.bias:
            module.proj.register_parameter("bias", None)  # F.linear then skips the add
        for name, child in module.named_children():
            if isinstance(child, xt.LayerNorm):
                dim = child.gamma.shape[0]
                setattr(module, name, nn.LayerNorm(dim, eps=spec.norm.params.eps))
    return model


def build_xtransformers(spec: ModelSpec, max_seq_len: int) -> nn.Module:
    """x-transformers' TransformerWrapper with the architecture of `spec`."""
    from x_transformers import Decoder, TransformerWrapper

    layers = Decoder(**xtransformers_kwargs(spec))
    position = spec.position.name
    model = TransformerWrapper(
        num_tokens=spec.vocab_size, max_seq_len=max_seq_len, attn_layers=layers,
        use_abs_pos_emb=position == "sinusoidal", scaled_sinu_pos_emb=position == "sinusoidal",
        tie_embedding=spec.tie_embeddings, tie_embedding_scale=1.0,
    )
    return align_xtransformers(model, spec)


def known_parameter_difference(spec: ModelSpec) -> tuple[int, str]:
    """x-transformers' parameters minus ours that no option removes, and why."""
    if spec.position.name == "sinusoidal":
        return 1, "x-transformers' sinusoidal table has a learned scalar gain"
    return 0, ""


@dataclass
class Pair:
    """One architecture in both implementations."""

    name: str
    spec: ModelSpec
    ours: nn.Module
    theirs: nn.Module


def build_pair(name: str, spec: Mapping[str, Any] | ModelSpec, max_seq_len: int) -> Pair:
    spec = parse_spec(spec)
    return Pair(name, spec, build_model(spec), build_xtransformers(spec, max_seq_len))


def count_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())  # shared (tied) tensors count once


def parameter_check(pair: Pair) -> dict[str, Any]:
    """Both counts, the documented difference, and whether they agree exactly."""
    ours, theirs = count_parameters(pair.ours), count_parameters(pair.theirs)
    expected, why = known_parameter_difference(pair.spec)
    return dict(ours=ours, theirs=theirs, difference=theirs - ours, matches=theirs - ours == expected,
                note=why)


# ---- timing ---------------------------------------------------------------------------------

IMPLS = ("ours", "x-transformers")


def alternate(runs: Mapping[str, Callable[[], Any]], warmup: int, repeats: int) -> dict[str, list[float]]:
    """Seconds per call of each run, interleaved (ABAB, then BABA...) so that load from other
    processes on a shared machine falls on both implementations alike."""
    for _ in range(warmup):
        for run in runs.values():
            run()
    times: dict[str, list[float]] = {name: [] for name in runs}
    names = list(runs)
    for r in range(repeats):
        for name in names if r % 2 == 0 else reversed(names):
            start = time.perf_counter()
            runs[name]()
            times[name].append(time.perf_counter() - start)
    return times


def median(values: list[float]) -> float:
    return statistics.median(values)


def make_train_step(model: nn.Module, tokens: Tensor) -> Callable[[], None]:
    """One forward + backward + AdamW step of next-token prediction on `tokens` [B, n + 1]."""
    inputs, targets = tokens[:, :-1], tokens[:, 1:]
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    model.train()

    def step() -> None:
        logits = model(inputs)  # (B, n, vocab)
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return step


def random_tokens(batch: int, length: int, vocab: int, seed: int = 0) -> Tensor:
    return torch.randint(0, vocab, (batch, length), generator=torch.Generator().manual_seed(seed))


def train_throughput(pair: Pair, batch: int, seq: int, warmup: int, repeats: int,
                     alongside: Mapping[str, Callable[[], Any]] | None = None) -> dict[str, Any]:
    """Tokens/s of a training step (median of `repeats`), both implementations alternated.
    `alongside` runs (e.g. the reference GEMM) are interleaved too, so they see the same load;
    their median seconds come back under "alongside_s"."""
    tokens = random_tokens(batch, seq + 1, pair.spec.vocab_size)
    steps = {IMPLS[0]: make_train_step(pair.ours, tokens), IMPLS[1]: make_train_step(pair.theirs, tokens)}
    times = alternate({**steps, **(alongside or {})}, warmup, repeats)
    seconds = {name: median(times[name]) for name in IMPLS}
    return dict(
        batch=batch, seq=seq, step_s=seconds, step_s_all={name: times[name] for name in IMPLS},
        tokens_per_s={name: batch * seq / s for name, s in seconds.items()},
        ratio=seconds[IMPLS[1]] / seconds[IMPLS[0]],
        alongside_s={name: median(times[name]) for name in alongside or {}},
    )


def decode_throughput(pair: Pair, batch: int, prompt_len: int, new_tokens: int, repeats: int) -> dict[str, Any]:
    """Greedy generation with a KV cache: new tokens/s (prompt prefill included in the time)."""
    from x_transformers import AutoregressiveWrapper

    prompt = random_tokens(batch, prompt_len, pair.spec.vocab_size, seed=1)
    wrapper = AutoregressiveWrapper(pair.theirs)
    pair.ours.eval()
    runs = {
        IMPLS[0]: lambda: pair.ours.generate(prompt, max_new_tokens=new_tokens, strategy="greedy", use_cache=True),
        IMPLS[1]: lambda: wrapper.generate(prompt, new_tokens, temperature=0.0, cache_kv=True),
    }
    with torch.inference_mode():
        times = alternate(runs, warmup=1, repeats=repeats)
    seconds = {name: median(t) for name, t in times.items()}
    return dict(
        batch=batch, prompt=prompt_len, new_tokens=new_tokens, seconds=seconds, seconds_all=times,
        tokens_per_s={name: batch * new_tokens / s for name, s in seconds.items()},
        ratio=seconds[IMPLS[1]] / seconds[IMPLS[0]],
    )
