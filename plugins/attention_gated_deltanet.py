"""Gated DeltaNet (Yang, Kautz & Hatamizadeh 2025, "Gated Delta Networks: Improving Mamba2 with
Delta Rule", ICLR 2025), laid out as Qwen3-Next's linear-attention layers (Hugging Face's
Qwen3NextGatedDeltaNet, whose torch fallbacks `torch_chunk_gated_delta_rule`,
`torch_recurrent_gated_delta_rule` and short convolution `causal_conv1d_fn` are the reference;
the same layer as flash-linear-attention's GatedDeltaNet). A linear-time token mixer: no softmax,
no keys kept per token; each head carries a state S of key_dim x value_dim numbers, written by
the gated delta rule

    S_t = a_t (I - b_t k_t k_t^T) S_{t-1} + b_t k_t v_t^T          o_t = S_t^T q_t

    q, k, v   = SiLU(causal depthwise conv of width conv_size (x W_qkv)), q and k L2-normalised
                per head (eps 1e-6 under the root, as FLA), q times key_dim^-0.5
    b_t       = sigmoid(x W_b)                                      (the write strength, beta)
    a_t       = exp(g_t),  g_t = -exp(A_log) softplus(x W_a + dt_bias)  (Mamba 2's decay, per value head)
    out       = (RMSNorm(o_t) * SiLU(x W_z)) W_out                  (per value head; a gain, no bias)

`key_heads` heads of queries and keys, `value_heads` (a multiple) of values and states: each
query/key head serves value_heads / key_heads consecutive value heads (Qwen3-Next: 16 and 32).
model.n_kv_heads does not apply, and no position scheme either (the convolution and the order of
the recurrence carry position); in a hybrid pattern the attention layers keep theirs.

Two forms, one function: training and the prompt run the chunkwise form (the WY/UT transform of
Yang et al. 2024, "Parallelizing Linear Transformers with the Delta Rule over Sequence Length", as
the reference does it: chunks of `chunk_size` solved with a triangular solve, a scan over chunks),
O(n (chunk (key_dim + value_dim) + key_dim value_dim)) time and O(n chunk) memory per head; a
decoding step runs the recurrence on the cached state. The cache (GatedDeltaNetCache) holds each
head's state and the last conv_size - 1 inputs of the convolution: a constant number of bytes per
sequence, whatever the length (`cache_bytes`).

Padding: a padding token is a no-op. Its convolution input is zero (Hugging Face zeroes the
padded hidden states; here the projected inputs, so a bias cannot leak either) and its step
neither decays nor writes the state (a_t = 1, b_t = 0), so left padding reaches neither the state
nor a real token's convolution window: a left-padded row equals that row alone.

Deviations: the reference computes the delta rule in float32 whatever the model's dtype (FLA's
kernels do); here it runs in the model's dtype, float32 for half-precision models (the state is
kept in float32 there: `cache_bytes` says so). The projections follow the model's `bias` field
(the reference has none). Qwen3-Next is a decoder; in an encoder (causal: false), whose paper has
no bidirectional form, the layer runs its recurrence over the sequence in both directions with
the same weights and sums the two before the output norm (the parameter-shared bidirectional
form of Caduceus, Schiff et al. 2024, "BiMamba"). Hugging Face's fused [q, k, v, z] per key head
and [b, a] projections map row by row to `in_proj` [q; k; v], `gate` (z), `beta` (b) and `decay` (a)
(tests/model/test_hf_parity_qwen3_next.py).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from pydantic import Field
from torch import Tensor, nn

from workbench import hookimpl
from workbench.errors import SpecError
from workbench.model.mixer import TokenMixer
from workbench.model.norm import RMSNorm
from workbench.variants import Params


class GatedDeltaNetParams(Params):
    key_heads: int | None = Field(None, gt=0, description="heads of queries and keys (default model.n_heads)")
    value_heads: int | None = Field(None, gt=0, description="heads of values and states, a multiple of key_heads "
                                    "(default key_heads; Qwen3-Next: twice)")
    key_dim: int | None = Field(None, gt=0, description="width of each query/key head (default model.head_dim)")
    value_dim: int | None = Field(None, gt=0, description="width of each value head (default model.head_dim)")
    conv_size: int = Field(4, ge=1, le=64, description="width of the short causal convolution on q, k and v")
    chunk_size: int = Field(64, ge=1, le=4096, description="tokens per chunk of the chunkwise form (the same "
                            "function at any size: a speed setting)")


def l2_normalise(x: Tensor) -> Tensor:
    """x / sqrt(sum x^2 + 1e-6) over the last axis (FLA's and the reference's `l2norm`)."""
    return x * torch.rsqrt(x.square().sum(-1, keepdim=True) + 1e-6)


def recurrent_delta_rule(q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor,
                         state: Tensor | None) -> tuple[Tensor, Tensor]:
    """The gated delta rule one token at a time: q, k [B, H, n, dk] (q already scaled), v
    [B, H, n, dv], g (log decay) and beta [B, H, n], state [B, H, dk, dv] or None (zeros).
    Returns the outputs [B, H, n, dv] and the final state."""
    B, H, n, dk = k.shape
    S = state if state is not None else k.new_zeros(B, H, dk, v.shape[-1])
    out = []
    for t in range(n):
        S = S * g[:, :, t, None, None].exp()
        k_t = k[:, :, t]  # [B, H, dk]
        error = v[:, :, t] - (k_t[..., None] * S).sum(-2)  # what S predicts for k_t, corrected
        S = S + k_t[..., None] * (beta[:, :, t, None] * error)[..., None, :]
        out.append((q[:, :, t, :, None] * S).sum(-2))
    return torch.stack(out, dim=2), S


def chunked_delta_rule(q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, state: Tensor | None,
                       chunk: int) -> tuple[Tensor, Tensor]:
    """The same function as `recurrent_delta_rule`, chunk tokens at a time.

    Within a chunk (positions i, j; G the cumulative log decay from the chunk's start), the
    delta rule's corrections form a unit lower-triangular system T = I + tril(b_i k_i.k_j
    e^(G_i - G_j), -1): solving it once gives each token's new value u (its write, before the
    state's prediction is subtracted) and w (the decayed keys that read the incoming state).
    Then per chunk c, in order: v_new = u - w S;  o = (q e^G) S + (q k^T e^(G_i - G_j), causal) v_new;
    S <- e^(G_last) S + (k e^(G_last - G))^T v_new. Every exponent is <= 0: nothing overflows."""
    B, H, n, dk = k.shape
    dv = v.shape[-1]
    C = min(chunk, n)
    pad = -n % C  # the tail: zero keys and values, no decay, no write (the state passes unchanged)
    if pad:
        q, k, v = (F.pad(x, (0, 0, 0, pad)) for x in (q, k, v))
        g, beta = (F.pad(x, (0, pad)) for x in (g, beta))
    N = (n + pad) // C
    q, k, v = (x.reshape(B, H, N, C, -1) for x in (q, k, v))
    g, beta = (x.reshape(B, H, N, C) for x in (g, beta))
    G = g.cumsum(-1)  # [B, H, N, C]
    causal = torch.ones(C, C, dtype=torch.bool, device=q.device).tril()
    decay = (G[..., :, None] - G[..., None, :]).masked_fill(~causal, float("-inf")).exp()  # [.., C, C], i from j
    k_beta = k * beta[..., None]
    T = ((k_beta @ k.transpose(-1, -2)) * decay).tril(-1)  # T - I: the unit diagonal is implied below
    u = torch.linalg.solve_triangular(T, v * beta[..., None], upper=False, unitriangular=True)
    w = torch.linalg.solve_triangular(T, k_beta * G.exp()[..., None], upper=False, unitriangular=True)
    scores = (q @ k.transpose(-1, -2)) * decay  # [B, H, N, C, C]
    q_read = q * G.exp()[..., None]
    k_write = k * (G[..., -1:] - G).exp()[..., None]
    carried = G[..., -1].exp()[..., None, None]  # [B, H, N, 1, 1]
    S = state if state is not None else q.new_zeros(B, H, dk, dv)
    out = []
    # unbind, not u[:, :, c]: each indexing's backward would write a whole zero tensor (O(N^2) in all)
    for u_c, w_c, q_c, scores_c, k_c, carried_c in zip(*(t.unbind(2) for t in (u, w, q_read, scores, k_write,
                                                                               carried))):
        v_new = u_c - w_c @ S
        out.append(q_c @ S + scores_c @ v_new)
        S = S * carried_c + k_c.transpose(-1, -2) @ v_new
    return torch.stack(out, dim=2).reshape(B, H, N * C, dv)[:, :, :n], S


class GatedDeltaNetCache:
    """One layer's decoding state: each value head's delta-rule state [B, value_heads, key_dim,
    value_dim] and the convolution's last conv_size - 1 inputs [B, channels, conv_size - 1]."""

    def __init__(self):
        self.state: Tensor | None = None
        self.conv: Tensor | None = None

    @property
    def empty(self) -> bool:
        return self.state is None

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.state, self.conv) if t is not None)


class GatedDeltaNet(TokenMixer):
    """Gated DeltaNet (Yang et al. 2025; Qwen3-Next's linear layers): a delta-rule state per head."""

    name = "gated_deltanet"
    Params = GatedDeltaNetParams

    def __init__(self, params: GatedDeltaNetParams, *, spec, layer, position):
        super().__init__(params, spec=spec, layer=layer, position=position)
        self.key_heads = params.key_heads or spec.n_heads
        self.value_heads = params.value_heads or self.key_heads
        if self.value_heads % self.key_heads:
            raise SpecError("model.attention.value_heads", f"each query/key head serves a whole number of value "
                            f"heads: {self.value_heads} is not a multiple of key_heads {self.key_heads}")
        self.key_dim, self.value_dim = params.key_dim or spec.head_dim, params.value_dim or spec.head_dim
        d, hv, dv = spec.d_model, self.value_heads, self.value_dim
        self.conv_size, self.chunk_size = params.conv_size, params.chunk_size
        self.channels = 2 * self.key_heads * self.key_dim + hv * dv  # [q; k; v], what the convolution mixes
        self.in_proj = nn.Linear(d, self.channels, bias=spec.bias)
        self.conv = nn.Conv1d(self.channels, self.channels, params.conv_size, groups=self.channels, bias=False)
        self.gate = nn.Linear(d, hv * dv, bias=spec.bias)  # z, the output gate
        self.beta = nn.Linear(d, hv, bias=spec.bias)
        self.decay = nn.Linear(d, hv, bias=spec.bias)
        self.A_log = nn.Parameter(torch.empty(hv).uniform_(0.01, 16).log())  # the reference's init
        self.dt_bias = nn.Parameter(torch.ones(hv))
        self.norm = RMSNorm(dv, eps=getattr(spec.at("norm", layer.index).params, "eps", 1e-6))
        self.out = nn.Linear(hv * dv, d, bias=spec.bias)
        self.dropout = nn.Dropout(spec.dropout)

    def new_cache(self, capacity: int) -> GatedDeltaNetCache:
        return GatedDeltaNetCache()  # constant size: the capacity does not matter

    def cache_bytes(self, tokens: int, batch: int, element: int) -> int:
        """value_heads * key_dim * value_dim state numbers (in float32 at least) and channels *
        (conv_size - 1) convolution inputs per sequence, whatever the number of tokens."""
        if tokens == 0:
            return 0
        state = self.value_heads * self.key_dim * self.value_dim * max(element, 4)
        return batch * (state + self.channels * (self.conv_size - 1) * element)

    def value_projection(self) -> Tensor:
        """The rows of `in_proj` that compute the values (DeepNorm's init scales them)."""
        return self.in_proj.weight[-self.value_heads * self.value_dim:]

    def forward(self, x: Tensor, seq, causal: bool, cache: GatedDeltaNetCache | None = None, state=None) -> Tensor:
        B, n, _ = x.shape
        wide = torch.float32 if x.dtype in (torch.float16, torch.bfloat16) else x.dtype  # the delta rule's dtype
        mixed = self.in_proj(x)  # [B, n, channels]
        beta = torch.sigmoid(self.beta(x).to(wide))  # [B, n, value_heads]
        g = -self.A_log.to(wide).exp() * F.softplus(self.decay(x).to(wide) + self.dt_bias.to(wide))  # log decay <= 0
        if seq.mask is not None:  # padding tokens are no-ops (module docstring)
            real = seq.mask[..., None]
            mixed, beta, g = mixed * real.to(x.dtype), beta * real.to(wide), g * real.to(wide)
        if causal:
            o = self.scan(mixed, beta, g, cache)
        else:  # both directions, the same weights, summed (module docstring)
            o = self.scan(mixed, beta, g, None) + self.scan(mixed.flip(1), beta.flip(1), g.flip(1), None).flip(1)
        z = self.gate(x).view(B, n, self.value_heads, self.value_dim)
        y = self.norm(o.to(x.dtype)) * F.silu(z)  # [B, n, value_heads, value_dim]
        return self.dropout(self.out(y.reshape(B, n, -1)))

    def scan(self, mixed: Tensor, beta: Tensor, g: Tensor, cache: GatedDeltaNetCache | None) -> Tensor:
        """The convolution and the delta rule over one direction: [B, n, value_heads, value_dim]."""
        B, n, _ = mixed.shape
        hk, hv, dk = self.key_heads, self.value_heads, self.key_dim
        history = mixed.new_zeros(B, self.channels, self.conv_size - 1) if cache is None or cache.empty else cache.conv
        window = torch.cat([history, mixed.transpose(1, 2)], dim=-1)  # [B, channels, conv_size - 1 + n]
        mixed = F.silu(F.conv1d(window, self.conv.weight, groups=self.channels)).transpose(1, 2)  # [B, n, channels]
        q, k, v = mixed.split([hk * dk, hk * dk, hv * self.value_dim], dim=-1)
        wide = g.dtype
        q, k = (l2_normalise(t.view(B, n, hk, dk).to(wide)).repeat_interleave(hv // hk, dim=2).transpose(1, 2)
                for t in (q, k))  # [B, hv, n, dk]: each key head serves hv / hk value heads
        q = q * dk**-0.5
        v = v.reshape(B, n, hv, -1).transpose(1, 2).to(wide)
        g, beta = g.transpose(1, 2), beta.transpose(1, 2)  # [B, hv, n]
        initial = None if cache is None or cache.empty else cache.state
        if initial is not None and n == 1:  # a decoding step
            o, final = recurrent_delta_rule(q, k, v, g, beta, initial)
        else:
            o, final = chunked_delta_rule(q, k, v, g, beta, initial, self.chunk_size)
        if cache is not None:
            cache.state, cache.conv = final, window[:, :, window.shape[-1] - (self.conv_size - 1):]
        return o.transpose(1, 2)


@hookimpl
def register_attention_variants():
    return [GatedDeltaNet]
