"""Multi-head latent attention (DeepSeek-AI 2024, "DeepSeek-V2", section 2.1; DeepSeek-V3;
Hugging Face's DeepseekV3Attention): keys and values are decoded from a shared low-rank latent
c = RMSNorm(x W_DKV) of `kv_rank` units per token, and position enters through a separate
`rope_dim`-wide key shared by every head ("decoupled RoPE"):

    q_h  = [x W_UQ_h ; RoPE(x W_QR_h)]               (through a `q_rank` latent and RMSNorm when q_rank is set)
    k_h  = [c W_UK_h ; RoPE(x W_KR)]                  v_h = c W_UV_h
    out  = sum_h softmax(q_h k_h^T / sqrt(nope_dim + rope_dim)) v_h W_O_h

so decoding caches c and RoPE(x W_KR) only: (kv_rank + rope_dim) numbers per token and layer,
against GQA's 2 * n_kv_heads * head_dim (`cache_bytes`; the cache test measures it). The nope
part of each head is `nope_dim` wide (default model.head_dim), the values `v_dim` (default
model.head_dim); model.n_kv_heads does not apply (every head decodes its own keys and values).

The latent RMSNorms take `latent_eps` (DeepSeek's reference builds them at its RMSNorm's default,
1e-6, not at the model's rms_norm_eps); by default model.norm's eps. The rotary part goes through
the model's position scheme, rebuilt at rope_dim when it rotates (RoPE: interleaved pairs
(x[2j], x[2j+1]), DeepSeek's `rope_interleave: true`, whose weights copy over unchanged; its
rotate-half layout is a permutation of the rotary rows: workbench.model.hf_latent); a scheme that
biases scores (ALiBi) biases them as usual.

Deviations: decoding expands the cached latent into keys and values at every step (as Hugging
Face does) instead of absorbing W_UK into the queries and W_UV into the output (the paper's
inference form: the same numbers, fewer FLOPs); YaRN's mscale is not applied.
"""

import torch
from pydantic import Field
from torch import Tensor, nn

from workbench import hookimpl
from workbench.errors import SpecError
from workbench.model.cache import LayerCache
from workbench.model.mixer import TokenMixer
from workbench.model.norm import RMSNorm
from workbench.model.position import PositionScheme
from workbench.model.spec import resolve_choice
from workbench.model.transformer import AttentionLayer
from workbench.variants import Params


class MLAParams(Params):
    kv_rank: int = Field(64, gt=0, description="width of the key/value latent c, what the cache holds per token")
    q_rank: int | None = Field(None, gt=0, description="width of a query latent (DeepSeek's q_lora_rank); null: "
                               "queries projected directly")
    rope_dim: int = Field(16, gt=0, description="width of the decoupled rotary part of each query and of the shared "
                          "rotary key (even)")
    nope_dim: int | None = Field(None, gt=0, description="width of each head's non-rotary query/key part (default "
                                 "model.head_dim)")
    v_dim: int | None = Field(None, gt=0, description="width of each head's value (default model.head_dim)")
    scaled: bool = Field(True, description="divide scores by sqrt(nope_dim + rope_dim); false: the unscaled ablation")
    latent_eps: float | None = Field(None, gt=0, description="eps of the RMSNorms on the latents (DeepSeek-V2/V3: "
                                     "1e-6 whatever their rms_norm_eps); null: model.norm's eps")
    added_later = ("latent_eps",)  # stored runs keep their ids


class MultiHeadLatentAttention(TokenMixer, AttentionLayer):
    """Multi-head latent attention (DeepSeek-V2/V3): keys and values from a cached low-rank latent."""

    name = "mla"
    Params = MLAParams
    residual_outputs = ("out.weight",)

    def __init__(self, params: MLAParams, *, spec, layer, position):
        super().__init__(params, spec=spec, layer=layer, position=position)
        if params.rope_dim % 2:
            raise SpecError("model.attention.rope_dim", f"RoPE rotates pairs: {params.rope_dim} must be even")
        d, h = spec.d_model, spec.n_heads
        self.n_heads = h
        self.nope_dim, self.v_dim = params.nope_dim or spec.head_dim, params.v_dim or spec.head_dim
        self.rope_dim, self.kv_rank = params.rope_dim, params.kv_rank
        qk_dim = self.nope_dim + self.rope_dim
        eps = params.latent_eps or getattr(spec.at("norm", layer.index).params, "eps", 1e-6)
        if params.q_rank is None:
            self.q = nn.Linear(d, h * qk_dim, bias=False)
        else:
            self.q_down = nn.Linear(d, params.q_rank, bias=spec.bias)
            self.q_norm = RMSNorm(params.q_rank, eps=eps)
            self.q = nn.Linear(params.q_rank, h * qk_dim, bias=False)
        self.kv_down = nn.Linear(d, self.kv_rank + self.rope_dim, bias=spec.bias)  # [c; shared rotary key]
        self.kv_norm = RMSNorm(self.kv_rank, eps=eps)
        self.kv_up = nn.Linear(self.kv_rank, h * (self.nope_dim + self.v_dim), bias=False)
        self.out = nn.Linear(h * self.v_dim, d, bias=spec.bias)
        self.dropout = nn.Dropout(spec.dropout)
        self.position = position
        rotates = type(position).rotate is not PositionScheme.rotate
        self.rotary = type(position)(position.params, d_model=d, n_heads=h, head_dim=self.rope_dim,
                                     causal=position.causal) if rotates else position
        full = resolve_choice("attention", {"name": "full", "scaled": params.scaled}, "model.attention")
        self.variant = full.cls(full.params, n_heads=h, n_kv_heads=h, head_dim=qk_dim)

    def value_projection(self) -> Tensor:
        """The rows of kv_up that decode the values from the latent, [h, v_dim, kv_rank] (a view;
        DeepNorm's init scales it): each head's rows are [nope keys; values]."""
        return self.kv_up.weight.view(self.n_heads, self.nope_dim + self.v_dim, self.kv_rank)[:, self.nope_dim:]

    def new_cache(self, capacity: int) -> LayerCache:
        return LayerCache(capacity)  # the latent c as "k" [B, 1, n, kv_rank], the rotary key as "v" [B, 1, n, rope_dim]

    def cache_bytes(self, tokens: int, batch: int, element: int) -> int:
        return (self.kv_rank + self.rope_dim) * tokens * batch * element

    def forward(self, x: Tensor, seq, causal: bool, cache: LayerCache | None = None, state=None) -> Tensor:
        B, n, _ = x.shape
        h = self.n_heads
        q = self.q(x if self.params.q_rank is None else self.q_norm(self.q_down(x)))
        q_nope, q_rope = q.view(B, n, h, -1).transpose(1, 2).split([self.nope_dim, self.rope_dim], dim=-1)
        latent, k_rope = self.kv_down(x).split([self.kv_rank, self.rope_dim], dim=-1)
        latent = self.kv_norm(latent)[:, None]  # (B, 1, n, kv_rank)
        q_rope, k_rope = self.rotary.rotate(q_rope, k_rope[:, None], seq.pos, seq.pos)  # (B, h, n, r), (B, 1, n, r)
        k_pos, key_mask = seq.pos, seq.mask
        if cache is not None:
            prompt = cache.empty
            cache.append(latent, k_rope, seq.pos, seq.mask)
            if not prompt:  # a decoding step reads every cached token's latent
                latent, k_rope, k_pos, key_mask = cache.k, cache.v, cache.pos, cache.mask
        m = latent.shape[2]
        kv = self.kv_up(latent[:, 0]).view(B, m, h, -1).transpose(1, 2)  # (B, h, m, nope + v)
        k_nope, v = kv.split([self.nope_dim, self.v_dim], dim=-1)
        q = torch.cat([q_nope, q_rope], dim=-1)  # (B, h, n, nope + rope)
        k = torch.cat([k_nope, k_rope.expand(B, h, m, self.rope_dim)], dim=-1)
        bias = self.position.score_bias if self.position.has_score_bias else None
        y = self.attend(q, k, v, seq.mask, q_pos=seq.pos, k_pos=k_pos, key_mask=key_mask, causal=causal,
                        score_bias=bias)  # (B, h, n, v_dim)
        return self.dropout(self.out(y.transpose(1, 2).reshape(B, n, h * self.v_dim)))


@hookimpl
def register_attention_variants():
    return [MultiHeadLatentAttention]
