"""Transformer models assembled from one spec. Read this file top to bottom.

    tokens -> token embedding (times sqrt(d_model), optional) -> position.embed -> embedding norm (optional) -> Block x n_layers
           -> final norm (pre) -> head
    Block:   y = attn(attn_norm.before(x));   x = attn_norm.after(attn_residual.add(x, attn_norm.output(y)))
             y = cross(cross_norm.before(x)); x = cross_norm.after(...)        (encoder_decoder's decoder)
             y = ffn(ffn_norm.before(x));     x = ffn_norm.after(ffn_residual.add(x, ffn_norm.output(y)))
             pre: before = norm   post: after = norm   sandwich: before and output   (the rest: identity)
             plain residual: add(x, y) = x + y      others: skip(x) + branch(y)

    attn (SelfAttention, the default token mixer):
             q, k, v = project(x)                 qkv projection, QK-norm (option), value residual (option)
             q, k = position.rotate(q, k)         RoPE; ALiBi and T5 give a score bias instead
             k, v = with_cache(k, v)              decoding reads every cached key
             y = attend(q, k, v)                  the attention variant's kernel (plugins/attention_*.py)
             out(gate(y))                         output gate (option), output projection

The five pluggable axes enter at five places: `position` (embedding, q/k rotation or score
bias), `attention` (which keys a query reads, and the kernel; or, for a mixer variant such as
differential or latent attention, the layer's whole token mixer: workbench.model.mixer), `norm`
(where each residual branch's norm sits), `ffn`, and `residual` (how each branch joins the
stream, and its init). Each may differ per layer (ModelSpec.at). The layers of one forward
share a `state` dict (value residual's first-layer values); modules add auxiliary losses
through workbench.model.losses. Families: EncoderModel (bidirectional), DecoderModel (causal LM)
and EncoderDecoderModel (encoder + causal decoder with cross-attention).
"""

from __future__ import annotations

import hashlib
import math
from collections import OrderedDict
from collections.abc import Callable, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn
from torch.utils.hooks import RemovableHandle

from workbench.model.attention import AttentionParams, AttentionVariant, kernel_options
from workbench.model.cache import KVCache, LayerCache
from workbench.model.flex import arange_positions
from workbench.model.mixer import Layer, TokenMixer
from workbench.model.norm import RMSNorm, make_norm
from workbench.model.position import INIT_STD
from workbench.model.residual import Depth, Residual, residual_outputs
from workbench.model.sampling import GenerationConfig, next_token
from workbench.model.spec import Choice, ModelSpec, canonical, parse_spec, resolve_choice


@dataclass
class Positions:
    """Per-token bookkeeping of a batch."""

    pos: Tensor  # [B, n] position of each token, counted from its row's first real token
    mask: Tensor | None  # [B, n] True for real tokens; None when nothing is padding

    @classmethod
    def of(cls, tokens: Tensor, padding_mask: Tensor | None) -> Positions:
        B, n = tokens.shape
        if padding_mask is None or bool(padding_mask.all()):
            return cls(arange_positions(B, n, tokens.device), None)
        mask = padding_mask.bool()
        # Left padding shifts a row's first real token; it still gets position 0.
        return cls((mask.cumsum(-1) - 1).clamp(min=0), mask)


# hook(weights [B, h, nq, nk], visible [B, 1 or h, nq, nk]): see AttentionLayer.register_weights_hook
WeightsHook = Callable[[Tensor, Tensor], None]


class AttentionLayer(nn.Module):
    """What attention layers share: their kernel variant's call, and hooks that see its weights."""

    variant: AttentionVariant  # set by the subclass
    values_from: str  # the projection whose last n_kv_heads * head_dim rows compute the values
    residual_outputs = ("out.weight",)  # what writes into the residual stream (workbench.model.residual)

    def __init__(self):
        super().__init__()
        self.weights_hooks: OrderedDict[int, WeightsHook] = OrderedDict()  # RemovableHandle needs a weakref

    def register_weights_hook(self, hook: WeightsHook) -> RemovableHandle:
        """Call `hook(weights, visible)` at every forward: the attention weights [B, h, nq, nk]
        (detached) and visible [B, 1 or h, nq, nk], True where a real query may read the key
        (the variant's pattern, causal and padding masks). While a hook is registered the layer
        runs its variant's explicit `dense` path (scores materialised: small inputs only).
        `handle.remove()` unregisters it, as with torch's module hooks."""
        handle = RemovableHandle(self.weights_hooks)
        self.weights_hooks[handle.id] = hook
        return handle

    def attend(self, q: Tensor, k: Tensor, v: Tensor, query_mask: Tensor | None, **kwargs) -> Tensor:
        """The variant on q, k, v -> (B, h, nq, hd); through `dense` while a weights hook is registered."""
        if not self.weights_hooks:
            return self.variant(q, k, v, **kwargs)
        y, weights = self.variant.dense(q, k, v, **kwargs, return_weights=True)
        visible = self.variant.visible_keys(kwargs["q_pos"], kwargs["k_pos"], kwargs["key_mask"], kwargs["causal"])
        if query_mask is not None:  # padding queries read nothing
            visible = visible & query_mask[:, None, :, None]
        for hook in self.weights_hooks.values():
            hook(weights.detach(), visible)
        return y

    def value_projection(self) -> Tensor:
        """The rows of the weight that compute the values, [n_kv_heads * head_dim, d_model] (a view;
        DeepNorm's init scales it)."""
        return getattr(self, self.values_from).weight[-self.n_kv_heads * self.head_dim:]


class SelfAttention(TokenMixer, AttentionLayer):
    """Multi-head self-attention around a kernel variant: one projection reshaped into heads (not
    slices of x), QK-norm, the position scheme, the KV cache, the kernel, the output gate and the
    output projection. Each step is a method, so a mixer that changes one of them subclasses this
    class and overrides it (workbench.model.mixer): `project` (queries, keys and values of the
    layer input), `attend` (the kernel on them), `output` (heads back to the stream).

    Options (attention.qk_norm, gate, value_residual), each off by default, compose with every kernel:
    - QK-norm: RMSNorm of queries and keys before the position scheme, per head (Qwen3, Gemma 3:
      one gain of head_dim shared by the heads) or over the whole projection (OLMo 2: one gain per
      unit), eps of model.norm; without a gain it is Llama 4's weightless norm.
    - Gated attention (Qiu et al. 2025, "Gated Attention for Large Language Models", their G1
      position): each head's output times sigmoid(x W_g), x the layer input, one gate per head or
      per unit, before the output projection.
    - Value residual (Zhou et al. 2025, "Value Residual Learning", ResFormer): every layer after
      the first attends over lambda1 * V_l + lambda2 * V_1, V_1 the first layer's values of the same
      tokens (left in the forward's `state`); lambdas 0.5 and 0.5, fixed or learned per layer.
    """

    values_from = "qkv"  # [q; k; v], or [q; v] with tie_qk
    FIRST_LAYER_VALUES = "first_layer_values"  # value residual's entry in the forward's state

    def __init__(self, params: AttentionParams, *, spec: ModelSpec, layer: Layer, position: nn.Module,
                 kernel: AttentionVariant | None = None):
        super().__init__(params, spec=spec, layer=layer, position=position)
        self.n_heads, self.n_kv_heads, self.head_dim = spec.n_heads, spec.n_kv_heads, spec.head_dim
        h, g, hd = self.n_heads, self.n_kv_heads, self.head_dim
        self.tie_qk = spec.tie_qk  # keys = queries: scores x Wq (x Wq)^T are symmetric
        self.qkv = nn.Linear(spec.d_model, (h + (0 if self.tie_qk else g) + g) * hd, bias=spec.bias)
        self.q_norm, self.k_norm = qk_norms(params, h, g, hd, getattr(spec.at("norm", layer.index).params, "eps", 1e-6))
        self.gate = None if params.gate == "none" else nn.Linear(
            spec.d_model, h * (hd if params.gate == "elementwise" else 1), bias=spec.bias)
        # value residual's (lambda1, lambda2) on the layers after the first: a parameter, or a fixed buffer
        lambdas = torch.full((2,), 0.5) if params.value_residual != "none" and layer.index > 0 else None
        if lambdas is not None and params.value_residual == "learned":
            self.value_mix = nn.Parameter(lambdas)
        else:
            self.register_buffer("value_mix", lambdas)
        self.out = nn.Linear(h * hd, spec.d_model, bias=spec.bias)
        self.dropout = nn.Dropout(spec.dropout)
        self.position = position  # shared by every layer of the stack that uses it
        self.variant = kernel if kernel is not None else self.make_kernel(params)

    def make_kernel(self, params: AttentionParams) -> AttentionVariant:
        """The kernel of a mixer subclass that names none: full attention, scaled (and softcapped) as
        its params say."""
        full = resolve_choice("attention", {"name": "full", **kernel_options(params)}, "model.attention")
        return full.cls(full.params, n_heads=self.n_heads, n_kv_heads=self.n_kv_heads, head_dim=self.head_dim)

    @property
    def cache_window(self) -> int | None:
        return self.variant.cache_window

    def cache_bytes(self, tokens: int, batch: int, element: int) -> int:
        held = min(tokens, self.cache_window) if self.cache_window else tokens
        return 2 * self.n_kv_heads * self.head_dim * held * batch * element

    def forward(self, x: Tensor, seq: Positions, causal: bool, cache: LayerCache | None = None,
                state: dict[str, Any] | None = None) -> Tensor:
        q, k, v = self.project(x, state)  # (B, h, n, hd), (B, h_kv, n, hd) x2
        q, k = self.position.rotate(q, k, seq.pos, seq.pos)
        k, v, k_pos, key_mask = self.with_cache(k, v, seq, cache)  # decoding: every cached key
        bias = self.position.score_bias if self.position.has_score_bias else None
        y = self.attend(q, k, v, seq.mask, q_pos=seq.pos, k_pos=k_pos, key_mask=key_mask, causal=causal,
                        score_bias=bias)  # (B, h, n, hd)
        return self.output(y, x)  # (B, n, d_model)

    def project(self, x: Tensor, state: dict[str, Any] | None) -> tuple[Tensor, Tensor, Tensor]:
        """Queries (B, h, n, hd), keys and values (B, h_kv, n, hd) of the layer input x."""
        B, n, _ = x.shape
        h, g, hd = self.n_heads, self.n_kv_heads, self.head_dim
        if self.tie_qk:
            q, v = self.qkv(x).split([h * hd, g * hd], dim=-1)
            k = None
        else:
            q, k, v = self.qkv(x).split([h * hd, g * hd, g * hd], dim=-1)
        if self.params.qk_norm == "projection":
            q, k = self.q_norm(q), None if k is None else self.k_norm(k)
        q = q.view(B, n, h, hd).transpose(1, 2)  # (B, h, n, hd)
        k = q if k is None else k.reshape(B, n, g, hd).transpose(1, 2)  # (B, g, n, hd)
        v = v.view(B, n, g, hd).transpose(1, 2)  # (B, g, n, hd)
        if self.params.qk_norm == "head":
            q = self.q_norm(q)
            k = q if self.tie_qk else self.k_norm(k)
        if self.params.value_residual != "none":
            v = self.value_residual(v, state)
        return q, k, v

    def value_residual(self, v: Tensor, state: dict[str, Any]) -> Tensor:
        """The first layer leaves its values in the state; every later layer mixes them into its own."""
        if self.value_mix is None:
            state[self.FIRST_LAYER_VALUES] = v
            return v
        return self.value_mix[0] * v + self.value_mix[1] * state[self.FIRST_LAYER_VALUES]

    def with_cache(self, k: Tensor, v: Tensor, seq: Positions, cache: LayerCache | None):
        """(keys, values, their positions, their mask): this forward's own, after storing them in
        the cache; during decoding (a cache that already holds the prompt), every cached one."""
        if cache is None:
            return k, v, seq.pos, seq.mask
        prompt = cache.empty
        cache.append(k, v, seq.pos, seq.mask)
        if prompt:
            return k, v, seq.pos, seq.mask
        return cache.k, cache.v, cache.pos, cache.mask

    def output(self, y: Tensor, x: Tensor) -> Tensor:
        """Heads y (B, h, n, hd) back to the stream (B, n, d_model): gate, output projection, dropout."""
        B, h, n, hd = y.shape
        if self.gate is not None:
            y = y * torch.sigmoid(self.gate(x)).view(B, n, h, -1).transpose(1, 2)  # (B, h, n, 1 or hd)
        y = y.transpose(1, 2).reshape(B, n, h * hd)
        return self.dropout(self.out(y))


def qk_norms(params: AttentionParams, h: int, g: int, hd: int, eps: float) -> tuple[nn.Module | None, ...]:
    """QK-norm's query and key norms (RMSNorm over a head, or over the whole projection)."""
    if params.qk_norm == "none":
        return None, None
    q_width, k_width = (hd, hd) if params.qk_norm == "head" else (h * hd, g * hd)
    return (RMSNorm(q_width, eps=eps, elementwise_affine=params.qk_norm_gain),
            RMSNorm(k_width, eps=eps, elementwise_affine=params.qk_norm_gain))


class CrossAttention(AttentionLayer):
    """Decoder queries read the encoder output with full attention and no position signal
    (positions already live in both streams)."""

    values_from = "kv"  # [k; v]

    def __init__(self, spec: ModelSpec, layer: int):
        super().__init__()
        self.n_heads, self.n_kv_heads, self.head_dim = spec.n_heads, spec.n_kv_heads, spec.head_dim
        self.q = nn.Linear(spec.d_model, self.n_heads * self.head_dim, bias=spec.bias)
        self.kv = nn.Linear(spec.d_model, 2 * self.n_kv_heads * self.head_dim, bias=spec.bias)
        self.out = nn.Linear(self.n_heads * self.head_dim, spec.d_model, bias=spec.bias)
        self.dropout = nn.Dropout(spec.dropout)
        full = spec.cross_attention(layer)
        self.variant = full.cls(full.params, n_heads=self.n_heads, n_kv_heads=self.n_kv_heads, head_dim=self.head_dim)

    def forward(self, x: Tensor, seq: Positions, memory: Tensor, memory_seq: Positions,
                cache: LayerCache | None = None) -> Tensor:
        B, n, _ = x.shape
        h, g, hd = self.n_heads, self.n_kv_heads, self.head_dim
        q = self.q(x).view(B, n, h, hd).transpose(1, 2)  # (B, h, n, hd)
        if cache is not None and not cache.empty:
            k, v = cache.k, cache.v
        else:
            k, v = self.kv(memory).view(B, -1, 2 * g, hd).transpose(1, 2).chunk(2, dim=1)  # (B, g, m, hd) x2
            if cache is not None:
                cache.append(k, v, memory_seq.pos, memory_seq.mask)
        y = self.attend(q, k, v, seq.mask, q_pos=seq.pos, k_pos=memory_seq.pos, key_mask=memory_seq.mask,
                        causal=False, score_bias=None)  # (B, h, n, hd)
        y = y.transpose(1, 2).reshape(B, n, h * hd)
        return self.dropout(self.out(y))


def make_mixer(spec: ModelSpec, layer: Layer, position: nn.Module) -> TokenMixer:
    """The token mixer of one layer: the attention variant itself when it is a mixer; a kernel
    variant inside the standard self-attention otherwise."""
    choice = spec.at("attention", layer.index)
    if issubclass(choice.cls, TokenMixer):
        return choice.cls(choice.params, spec=spec, layer=layer, position=position)
    kernel = choice.cls(choice.params, n_heads=spec.n_heads, n_kv_heads=spec.n_kv_heads, head_dim=spec.head_dim)
    return SelfAttention(choice.params, spec=spec, layer=layer, position=position, kernel=kernel)


def make_placement(spec: ModelSpec, layer: int) -> nn.Module:
    norm = spec.at("norm", layer)
    return norm.cls(norm.params, d_model=spec.d_model)


def make_residual(spec: ModelSpec, layer: Layer) -> Residual:
    residual = spec.at("residual", layer.index)
    return residual.cls(residual.params, d_model=spec.d_model, depth=layer.depth)


class Block(nn.Module):
    """One layer: self-attention (its token mixer), cross-attention (encoder_decoder's decoder),
    feed-forward. Each variant is the one its spec field gives for this layer."""

    def __init__(self, spec: ModelSpec, position: nn.Module, causal: bool, cross: bool, layer: Layer):
        super().__init__()
        i = layer.index
        self.causal = causal
        self.attn = make_mixer(spec, layer, position)
        self.attn_norm = make_placement(spec, i)
        self.attn_residual = make_residual(spec, layer)
        self.cross = self.cross_norm = self.cross_residual = None
        if cross:
            self.cross = CrossAttention(spec, i)
            self.cross_norm = make_placement(spec, i)
            self.cross_residual = make_residual(spec, layer)
        self.ffn = self.ffn_norm = self.ffn_residual = None  # `ffn: none` leaves the sublayer out, its norm included
        ffn = spec.at("ffn", i)
        if ffn.cls.is_sublayer:
            self.ffn = ffn.cls(ffn.params, d_model=spec.d_model, bias=spec.bias)
            self.ffn_norm = make_placement(spec, i)
            self.ffn_residual = make_residual(spec, layer)
        self.ffn_dropout = nn.Dropout(spec.dropout)

    def forward(self, x: Tensor, seq: Positions, memory: Tensor | None = None,
                memory_seq: Positions | None = None, cache: KVCache | None = None, layer: int = 0,
                state: dict[str, Any] | None = None) -> Tensor:
        # Each sublayer is a residual branch; the norm placement puts its norm on the branch's
        # input (pre: `before`) or on the sum (post: `after`); the other one is the identity.
        # The residual connection joins the branch to the stream: skip(x) + branch(y), plain x + y.
        self_cache = cache.self_attn_of(layer, self.attn) if cache is not None else None
        y = self.attn(self.attn_norm.before(x), seq, self.causal, self_cache, state)  # (B, n, d_model)
        x = self.attn_norm.after(self.attn_residual.add(x, self.attn_norm.output(y)))
        if self.cross is not None:
            cross_cache = cache.cross_attn[layer] if cache is not None else None
            y = self.cross(self.cross_norm.before(x), seq, memory, memory_seq, cross_cache)
            x = self.cross_norm.after(self.cross_residual.add(x, self.cross_norm.output(y)))
        if self.ffn is not None:
            y = self.ffn_dropout(self.ffn(self.ffn_norm.before(x)))  # (B, n, d_model)
            x = self.ffn_norm.after(self.ffn_residual.add(x, self.ffn_norm.output(y)))
        return x

    def branches(self) -> list[tuple[nn.Module, Residual]]:
        """Each sublayer the block has, with the residual connection that joins it to the stream."""
        pairs = [(self.attn, self.attn_residual), (self.cross, self.cross_residual), (self.ffn, self.ffn_residual)]
        return [(sublayer, residual) for sublayer, residual in pairs if sublayer is not None]


class Stack(nn.Module):
    """Token embedding, position scheme, blocks and (for pre-norm) a final norm."""

    def __init__(self, spec: ModelSpec, n_layers: int, causal: bool, cross: bool, embedding: nn.Embedding):
        super().__init__()
        self.embedding = embedding  # shared by encoder, decoder and the tied output head
        schemes = {canonical(c): position_scheme(spec, c, causal) for c in spec.each("position")}
        self.position = next(iter(schemes.values()))  # the scheme whose `embed` reads the stack's input
        if len(schemes) > 1:  # per-layer schemes (they act inside attention only: ModelSpec checks it)
            self.layer_positions = nn.ModuleList(list(schemes.values())[1:])
        # BERT's, BART's `layernorm_embedding` and BLOOM's `word_embeddings_layernorm`: one per stack
        norm = spec.at("norm", 0)
        self.embedding_norm = nn.Identity() if spec.embedding_norm == "none" else make_norm(
            norm.params.model_copy(update={"type": spec.embedding_norm}), spec.d_model)
        self.embedding_scale = math.sqrt(spec.d_model) if spec.embedding_scale == "sqrt_d_model" else None
        self.dropout = nn.Dropout(spec.dropout)
        depth = Depth.of(spec, in_decoder=causal)
        self.blocks = nn.ModuleList(
            Block(spec, schemes[canonical(spec.at("position", i))], causal, cross, Layer(i, depth))
            for i in range(n_layers))
        last = spec.at("norm", n_layers - 1)  # the stack ends as its last layer's placement says
        self.final_norm = make_placement(spec, n_layers - 1).norm if last.cls.final_norm else nn.Identity()

    def forward(self, tokens: Tensor, seq: Positions, memory: Tensor | None = None,
                memory_seq: Positions | None = None, cache: KVCache | None = None) -> Tensor:
        for scheme in self.schemes():
            scheme.check_length(seq.pos)
        x = self.embedding(tokens)  # (B, n, d_model), RMS INIT_STD at init
        if self.embedding_scale is not None:
            x = x * self.embedding_scale
        x = self.dropout(self.embedding_norm(self.position.embed(x, seq.pos)))
        state: dict[str, Any] = {}  # what layers leave for later layers of this forward (workbench.model.mixer)
        for i, block in enumerate(self.blocks):
            x = block(x, seq, memory, memory_seq, cache, i, state)
        return self.final_norm(x)  # (B, n, d_model)

    def schemes(self) -> list[nn.Module]:
        return [self.position, *getattr(self, "layer_positions", [])]


def position_scheme(spec: ModelSpec, choice: Choice, causal: bool) -> nn.Module:
    return choice.cls(choice.params, d_model=spec.d_model, n_heads=spec.n_heads, head_dim=spec.head_dim, causal=causal)


class Transformer(nn.Module):
    """Parts every family shares: the spec, the token embedding, the LM head, init."""

    def __init__(self, spec: ModelSpec):
        super().__init__()
        self.spec = spec
        self.embedding = nn.Embedding(spec.vocab_size, spec.d_model)
        self.head = nn.Linear(spec.d_model, spec.vocab_size, bias=False)
        if spec.tie_embeddings:
            self.head.weight = self.embedding.weight

    def _init_weights(self, seed: int | None = None) -> None:
        # GPT-2 init (as nanoGPT): N(0, 0.02) for every matrix and table (token embeddings, learned
        # positions), output projections (what each sublayer names in `residual_outputs`) scaled by
        # depth so residual sums stay O(1); then each residual connection's init_branch. Vaswani et al.
        # 3.4 instead start tokens at unit RMS (N(0, d^-0.5) times sqrt(d)), far above what the
        # blocks add at init, and our small studies learned much slower that way (quickstart's
        # reverse, rope, 300 steps: accuracy@12 0.28 against 0.64). Additive position schemes scale
        # themselves to INIT_STD instead (position.py), keeping Vaswani's position/token ratio.
        # Without a seed the matrices draw in turn from torch's global generator, so a model with one
        # module more draws other values for every matrix after it; with one, each matrix draws from
        # a generator of its own (parameter_generator): the same values in every model that has it.
        depth = 2 * max(self.spec.encoder_layers, self.spec.decoder_layers)
        branches = [pair for block in self.modules() if isinstance(block, Block) for pair in block.branches()]
        depth_scaled = {id(p) for sublayer, residual in branches if residual.depth_scaled_init
                        for p in residual_outputs(sublayer)}
        for name, p in self.named_parameters():
            if p.dim() < 2:
                continue  # norms keep ones/zeros, biases zeros
            std = INIT_STD / math.sqrt(depth) if id(p) in depth_scaled else INIT_STD
            generator = None if seed is None else parameter_generator(seed, name, p.shape)
            nn.init.normal_(p, mean=0.0, std=std, generator=generator)
        for m in self.modules():
            if isinstance(m, nn.Linear) and m.bias is not None:
                nn.init.zeros_(m.bias)
        for sublayer, residual in branches:
            residual.init_branch(sublayer)

    def logits(self, hidden: Tensor) -> Tensor:
        """The output head on the final hidden states; with model.logit_softcap, Gemma 2's
        cap * tanh(logits / cap)."""
        logits = self.head(hidden)
        cap = self.spec.logit_softcap
        return logits if cap is None else cap * torch.tanh(logits / cap)

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())

    # ---- generation (decoder and encoder_decoder) -------------------------------------------

    @torch.no_grad()
    def _generate(self, prefix: Tensor, step, n_layers: int, settings: GenerationConfig,
                  prefix_mask: Tensor | None, generator: torch.Generator | None, cross_capacity: int = 0) -> Tensor:
        """Shared loop. `step(tokens, seq, cache)` returns logits of the given tokens."""
        B, n = prefix.shape
        cache = None
        if settings.use_cache:  # each layer's mixer sizes its own cache (a sliding window keeps its window)
            cache = KVCache(n_layers, n + settings.max_new_tokens, cross_capacity)
        tokens, mask = prefix, prefix_mask
        seq = Positions.of(prefix, prefix_mask)
        next_pos = seq.pos[:, -1] + 1  # [B]
        finished = torch.zeros(B, dtype=torch.bool, device=prefix.device)
        logits = step(prefix, seq, cache)[:, -1]  # [B, vocab]
        for _ in range(settings.max_new_tokens):
            new = next_token(logits, settings, generator)  # [B]
            new = torch.where(finished, torch.full_like(new, settings.pad_id), new)
            tokens = torch.cat([tokens, new[:, None]], dim=1)
            if mask is not None:
                mask = torch.cat([mask, torch.ones_like(new[:, None], dtype=torch.bool)], dim=1)
            if settings.eos_id is not None:
                finished |= new == settings.eos_id
                if bool(finished.all()):
                    break
            if settings.use_cache:
                logits = step(new[:, None], Positions(next_pos[:, None], None), cache)[:, -1]
            else:
                logits = step(tokens, Positions.of(tokens, mask), None)[:, -1]
            next_pos = next_pos + 1
        self.last_cache = cache  # kept for inspection (cache bytes) until the next call
        return tokens


class EncoderModel(Transformer):
    """Bidirectional encoder (BERT-like): per-token logits, and a sequence-classification head."""

    def __init__(self, spec: ModelSpec):
        super().__init__(spec)
        self.encoder = Stack(spec, spec.encoder_layers, causal=False, cross=False, embedding=self.embedding)
        self.classifier = nn.Linear(spec.d_model, spec.n_classes) if spec.n_classes else None
        self._init_weights()

    def encode(self, tokens: Tensor, padding_mask: Tensor | None = None) -> Tensor:
        return self.encoder(tokens, Positions.of(tokens, padding_mask))  # (B, n, d_model)

    def forward(self, tokens: Tensor, padding_mask: Tensor | None = None) -> Tensor:
        return self.logits(self.encode(tokens, padding_mask))  # (B, n, vocab)

    def classify(self, tokens: Tensor, padding_mask: Tensor | None = None) -> Tensor:
        """Mean over real tokens, then a linear head: (B, n_classes)."""
        if self.classifier is None:
            raise ValueError("this encoder has no classification head: set model.n_classes")
        hidden = self.encode(tokens, padding_mask)
        if padding_mask is None:
            pooled = hidden.mean(dim=1)
        else:
            weights = padding_mask.to(hidden.dtype)[..., None]
            pooled = (hidden * weights).sum(1) / weights.sum(1).clamp(min=1)
        return self.classifier(pooled)


class DecoderModel(Transformer):
    """Causal language model (GPT-like)."""

    def __init__(self, spec: ModelSpec):
        super().__init__(spec)
        self.decoder = Stack(spec, spec.decoder_layers, causal=True, cross=False, embedding=self.embedding)
        self._init_weights()

    def forward(self, tokens: Tensor, padding_mask: Tensor | None = None) -> Tensor:
        return self.logits(self.decoder(tokens, Positions.of(tokens, padding_mask)))  # (B, n, vocab)

    def generate(self, prompt: Tensor, max_new_tokens: int = 32, strategy: str = "greedy",
                 temperature: float = 1.0, top_k: int | None = None, top_p: float | None = None,
                 eos_id: int | None = None, pad_id: int = 0, use_cache: bool = True,
                 padding_mask: Tensor | None = None, generator: torch.Generator | None = None) -> Tensor:
        """Continue `prompt` [B, n] (left-padded when rows differ in length; `padding_mask`
        marks real tokens). Returns [B, n + new]; rows that emitted `eos_id` continue with
        `pad_id`. `strategy` is "greedy" or "sample" (temperature, top_k, top_p)."""

        def step(tokens: Tensor, seq: Positions, cache: KVCache | None) -> Tensor:
            return self.logits(self.decoder(tokens, seq, cache=cache))

        settings = GenerationConfig(max_new_tokens, strategy, temperature, top_k, top_p, eos_id, pad_id, use_cache)
        return self._generate(prompt, step, len(self.decoder.blocks), settings, padding_mask, generator)


class EncoderDecoderModel(Transformer):
    """Encoder + causal decoder whose blocks cross-attend to the encoder output (T5-like)."""

    def __init__(self, spec: ModelSpec):
        super().__init__(spec)
        self.encoder = Stack(spec, spec.encoder_layers, causal=False, cross=False, embedding=self.embedding)
        self.decoder = Stack(spec, spec.decoder_layers, causal=True, cross=True, embedding=self.embedding)
        self._init_weights()

    def encode(self, src: Tensor, src_padding_mask: Tensor | None = None) -> tuple[Tensor, Positions]:
        src_seq = Positions.of(src, src_padding_mask)
        return self.encoder(src, src_seq), src_seq

    def forward(self, src: Tensor, tgt: Tensor, src_padding_mask: Tensor | None = None,
                tgt_padding_mask: Tensor | None = None) -> Tensor:
        memory, src_seq = self.encode(src, src_padding_mask)
        hidden = self.decoder(tgt, Positions.of(tgt, tgt_padding_mask), memory, src_seq)
        return self.logits(hidden)  # (B, n_tgt, vocab)

    def generate(self, src: Tensor, max_new_tokens: int = 32, strategy: str = "greedy",
                 temperature: float = 1.0, top_k: int | None = None, top_p: float | None = None,
                 eos_id: int | None = None, pad_id: int = 0, use_cache: bool = True,
                 src_padding_mask: Tensor | None = None, bos_id: int = 1,
                 generator: torch.Generator | None = None) -> Tensor:
        """Translate `src` [B, m]: the target starts with `bos_id`. Returns [B, 1 + new]."""
        memory, src_seq = self.encode(src, src_padding_mask)

        def step(tokens: Tensor, seq: Positions, cache: KVCache | None) -> Tensor:
            return self.logits(self.decoder(tokens, seq, memory, src_seq, cache=cache))

        start = torch.full((src.shape[0], 1), bos_id, dtype=torch.long, device=src.device)
        settings = GenerationConfig(max_new_tokens, strategy, temperature, top_k, top_p, eos_id, pad_id, use_cache)
        return self._generate(start, step, len(self.decoder.blocks), settings, None, generator,
                              cross_capacity=src.shape[1])


FAMILIES = {"encoder": EncoderModel, "decoder": DecoderModel, "encoder_decoder": EncoderDecoderModel}


def parameter_generator(seed: int, name: str, shape: torch.Size) -> torch.Generator:
    """A CPU generator for one parameter's initial values, seeded by (seed, its name, its shape):
    two models built with one seed draw the same values for a parameter they share by name and
    shape, and independent ones for any other (common random numbers across paired arms)."""
    digest = hashlib.blake2b(f"{seed}/{name}/{tuple(shape)}".encode(), digest_size=8).digest()
    return torch.Generator().manual_seed(int.from_bytes(digest, "little"))


def build_model(spec: Mapping[str, Any] | ModelSpec, init_seed: int | None = None) -> Transformer:
    """Build a model from a study's `model:` mapping. Raises SpecError naming a bad field.
    With `init_seed` every matrix is drawn again from a generator of its own
    (`parameter_generator`), the distributions unchanged: `train.init: paired`."""
    spec = parse_spec(spec)
    model = FAMILIES[spec.family](spec)
    if init_seed is not None:
        model._init_weights(init_seed)
    return model


class RecordedAttention(dict):
    """{layer name: [weights [B, h, nq, nk] per forward call]}, and `visible`, the same layout of
    boolean masks [B, 1 or h, nq, nk]: True where a real query may read the key (the variant's
    pattern, causal and padding masks). A weight of 0 on a visible key is a saturated softmax,
    not a mask."""

    def __init__(self, names: list[str]):
        super().__init__({name: [] for name in names})
        self.visible: dict[str, list[Tensor]] = {name: [] for name in names}

    def hook(self, name: str) -> WeightsHook:
        """The weights hook that appends layer `name`'s calls."""
        def record(weights: Tensor, visible: Tensor) -> None:
            self[name].append(weights)
            self.visible[name].append(visible)
        return record


@contextmanager
def record_attention(model: nn.Module):
    """Within the block, attention layers record their weights [B, h, nq, nk] (explicit scores:
    small inputs only). Yields a RecordedAttention: {layer name: [weights per forward call]}."""
    layers = {name: m for name, m in model.named_modules() if isinstance(m, AttentionLayer)}
    recorded = RecordedAttention(list(layers))
    handles = [m.register_weights_hook(recorded.hook(name)) for name, m in layers.items()]
    try:
        yield recorded
    finally:
        for handle in handles:
            handle.remove()


def attention_entropy(recorded: RecordedAttention) -> tuple[float, int]:
    """Normalised attention entropy of recorded forward calls: (sum over rows, rows).

    A row is one (layer, head, real query) of self- or cross-attention (encoder_decoder's
    cross-attention rows count too: the 1/sqrt(d_k) scale applies to them as well). Its entropy
    -sum p ln p over the keys it can see is divided by ln(number of those keys), so it lies in
    [0, 1]: 1 is uniform over the visible keys, 0 all weight on one key (a saturated softmax).
    Rows that see a single key are left out (their entropy is 0 whatever the scores)."""
    total, rows = 0.0, 0
    for name, calls in recorded.items():
        for weights, visible in zip(calls, recorded.visible[name]):
            n_keys = visible.expand_as(weights).sum(-1)  # [B, h, nq]
            entropy = -torch.xlogy(weights.double(), weights.double()).sum(-1)  # masked weights are exactly 0
            counted = n_keys > 1
            total += float((entropy[counted] / n_keys[counted].double().log()).sum())
            rows += int(counted.sum())
    return total, rows


def first_token_attention(recorded: RecordedAttention) -> tuple[float, int]:
    """The weight rows put on the first key, of recorded forward calls: (sum over rows, rows). A
    row is one (layer, head, real query) that sees the first key and at least one more (the first
    query, which sees only itself, is left out, as in attention_entropy): the attention sink's
    share (Xiao et al. 2023, "Efficient Streaming Language Models with Attention Sinks")."""
    total, rows = 0.0, 0
    for name, calls in recorded.items():
        for weights, visible in zip(calls, recorded.visible[name]):
            seen = visible.expand_as(weights)
            counted = seen[..., 0] & (seen.sum(-1) > 1)  # [B, h, nq]
            total += float(weights[..., 0].double()[counted].sum())
            rows += int(counted.sum())
    return total, rows
