"""Transformer models assembled from one spec. Read this file top to bottom.

    tokens -> token embedding -> position.embed -> embedding norm (optional) -> Block x n_layers
           -> final norm (pre) -> head
    Block:   x = attn_residual.add(x, attn(attn_norm.before(x)));    x = attn_norm.after(x)
             x = cross_residual.add(x, cross(cross_norm.before(x))); x = cross_norm.after(x)   (encoder_decoder's decoder)
             x = ffn_residual.add(x, ffn(ffn_norm.before(x)));       x = ffn_norm.after(x)
             pre: before = norm, after = identity   post: before = identity, after = norm
             plain residual: add(x, y) = x + y      others: skip(x) + branch(y)

The five pluggable axes enter at five places: `position` (embedding, q/k rotation or score
bias), `attention` (which keys a query reads, and the kernel), `norm` (where each residual
branch's norm sits), `ffn`, and `residual` (how each branch joins the stream, and its init).
Families: EncoderModel (bidirectional), DecoderModel (causal LM) and EncoderDecoderModel
(encoder + causal decoder with cross-attention).
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

from workbench.model.attention import AttentionVariant
from workbench.model.cache import KVCache, LayerCache
from workbench.model.flex import arange_positions
from workbench.model.norm import make_norm
from workbench.model.position import INIT_STD
from workbench.model.residual import Depth, Residual, residual_outputs
from workbench.model.sampling import GenerationConfig, next_token
from workbench.model.spec import ModelSpec, parse_spec


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
    """What self- and cross-attention share: their variant's call, and hooks that see its weights."""

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


class SelfAttention(AttentionLayer):
    """Multi-head self-attention: one projection reshaped into heads (not slices of x)."""

    values_from = "qkv"  # [q; k; v], or [q; v] with tie_qk

    def __init__(self, spec: ModelSpec, position: nn.Module):
        super().__init__()
        self.n_heads, self.n_kv_heads, self.head_dim = spec.n_heads, spec.n_kv_heads, spec.head_dim
        self.tie_qk = spec.tie_qk  # keys = queries: scores x Wq (x Wq)^T are symmetric
        n_proj_heads = self.n_heads + (0 if self.tie_qk else self.n_kv_heads) + self.n_kv_heads
        self.qkv = nn.Linear(spec.d_model, n_proj_heads * self.head_dim, bias=spec.bias)
        self.out = nn.Linear(self.n_heads * self.head_dim, spec.d_model, bias=spec.bias)
        self.dropout = nn.Dropout(spec.dropout)
        self.position = position  # shared by every layer of the stack
        self.variant = spec.attention.cls(
            spec.attention.params, n_heads=self.n_heads, n_kv_heads=self.n_kv_heads, head_dim=self.head_dim
        )

    def forward(self, x: Tensor, seq: Positions, causal: bool, cache: LayerCache | None = None) -> Tensor:
        B, n, _ = x.shape
        h, g, hd = self.n_heads, self.n_kv_heads, self.head_dim
        if self.tie_qk:
            q, v = self.qkv(x).split([h * hd, g * hd], dim=-1)
            k = q
        else:
            q, k, v = self.qkv(x).split([h * hd, g * hd, g * hd], dim=-1)
        q = q.view(B, n, h, hd).transpose(1, 2)  # (B, h, n, hd)
        k = k.reshape(B, n, g, hd).transpose(1, 2)  # (B, g, n, hd)
        v = v.view(B, n, g, hd).transpose(1, 2)  # (B, g, n, hd)
        q, k = self.position.rotate(q, k, seq.pos, seq.pos)
        bias = self.position.score_bias if self.position.has_score_bias else None

        if cache is None or cache.empty:  # training, or the prompt of a generation
            k_pos, key_mask = seq.pos, seq.mask
            if cache is not None:
                cache.append(k, v, seq.pos, seq.mask)
        else:  # one decoding step: read every cached key
            cache.append(k, v, seq.pos, seq.mask)
            k, v, k_pos, key_mask = cache.k, cache.v, cache.pos, cache.mask
        y = self.attend(q, k, v, seq.mask, q_pos=seq.pos, k_pos=k_pos, key_mask=key_mask, causal=causal,
                        score_bias=bias)  # (B, h, n, hd)
        y = y.transpose(1, 2).reshape(B, n, h * hd)
        return self.dropout(self.out(y))


class CrossAttention(AttentionLayer):
    """Decoder queries read the encoder output with full attention and no position signal
    (positions already live in both streams)."""

    values_from = "kv"  # [k; v]

    def __init__(self, spec: ModelSpec):
        super().__init__()
        self.n_heads, self.n_kv_heads, self.head_dim = spec.n_heads, spec.n_kv_heads, spec.head_dim
        self.q = nn.Linear(spec.d_model, self.n_heads * self.head_dim, bias=spec.bias)
        self.kv = nn.Linear(spec.d_model, 2 * self.n_kv_heads * self.head_dim, bias=spec.bias)
        self.out = nn.Linear(self.n_heads * self.head_dim, spec.d_model, bias=spec.bias)
        self.dropout = nn.Dropout(spec.dropout)
        full = spec.cross_attention
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


def make_placement(spec: ModelSpec) -> nn.Module:
    return spec.norm.cls(spec.norm.params, d_model=spec.d_model)


def make_residual(spec: ModelSpec, depth: Depth) -> Residual:
    return spec.residual.cls(spec.residual.params, d_model=spec.d_model, depth=depth)


class Block(nn.Module):
    """One layer: self-attention, cross-attention (encoder_decoder's decoder), feed-forward."""

    def __init__(self, spec: ModelSpec, position: nn.Module, causal: bool, cross: bool, depth: Depth):
        super().__init__()
        self.causal = causal
        self.attn = SelfAttention(spec, position)
        self.attn_norm = make_placement(spec)
        self.attn_residual = make_residual(spec, depth)
        self.cross = self.cross_norm = self.cross_residual = None
        if cross:
            self.cross = CrossAttention(spec)
            self.cross_norm = make_placement(spec)
            self.cross_residual = make_residual(spec, depth)
        self.ffn = self.ffn_norm = self.ffn_residual = None  # `ffn: none` leaves the sublayer out, its norm included
        if spec.ffn.cls.is_sublayer:
            self.ffn = spec.ffn.cls(spec.ffn.params, d_model=spec.d_model, bias=spec.bias)
            self.ffn_norm = make_placement(spec)
            self.ffn_residual = make_residual(spec, depth)
        self.ffn_dropout = nn.Dropout(spec.dropout)

    def forward(self, x: Tensor, seq: Positions, memory: Tensor | None = None,
                memory_seq: Positions | None = None, cache: KVCache | None = None, layer: int = 0) -> Tensor:
        # Each sublayer is a residual branch; the norm placement puts its norm on the branch's
        # input (pre: `before`) or on the sum (post: `after`); the other one is the identity.
        # The residual connection joins the branch to the stream: skip(x) + branch(y), plain x + y.
        self_cache = cache.self_attn[layer] if cache is not None else None
        x = self.attn_residual.add(x, self.attn(self.attn_norm.before(x), seq, self.causal, self_cache))  # (B, n, d_model)
        x = self.attn_norm.after(x)
        if self.cross is not None:
            cross_cache = cache.cross_attn[layer] if cache is not None else None
            x = self.cross_residual.add(x, self.cross(self.cross_norm.before(x), seq, memory, memory_seq, cross_cache))
            x = self.cross_norm.after(x)
        if self.ffn is not None:
            x = self.ffn_residual.add(x, self.ffn_dropout(self.ffn(self.ffn_norm.before(x))))  # (B, n, d_model)
            x = self.ffn_norm.after(x)
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
        self.position = spec.position.cls(
            spec.position.params, d_model=spec.d_model, n_heads=spec.n_heads, head_dim=spec.head_dim, causal=causal
        )
        # BERT's, BART's `layernorm_embedding` and BLOOM's `word_embeddings_layernorm`: one per stack
        self.embedding_norm = nn.Identity() if spec.embedding_norm == "none" else make_norm(
            spec.norm.params.model_copy(update={"type": spec.embedding_norm}), spec.d_model)
        self.dropout = nn.Dropout(spec.dropout)
        depth = Depth.of(spec, in_decoder=causal)
        self.blocks = nn.ModuleList(Block(spec, self.position, causal, cross, depth) for _ in range(n_layers))
        final = spec.norm.cls.final_norm
        self.final_norm = make_placement(spec).norm if final else nn.Identity()

    def forward(self, tokens: Tensor, seq: Positions, memory: Tensor | None = None,
                memory_seq: Positions | None = None, cache: KVCache | None = None) -> Tensor:
        self.position.check_length(seq.pos)
        x = self.embedding(tokens)  # (B, n, d_model), RMS INIT_STD at init
        x = self.dropout(self.embedding_norm(self.position.embed(x, seq.pos)))
        for i, block in enumerate(self.blocks):
            x = block(x, seq, memory, memory_seq, cache, i)
        return self.final_norm(x)  # (B, n, d_model)


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

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())

    # ---- generation (decoder and encoder_decoder) -------------------------------------------

    @torch.no_grad()
    def _generate(self, prefix: Tensor, step, n_layers: int, settings: GenerationConfig,
                  prefix_mask: Tensor | None, generator: torch.Generator | None, cross_capacity: int = 0) -> Tensor:
        """Shared loop. `step(tokens, seq, cache)` returns logits of the given tokens."""
        B, n = prefix.shape
        cache = None
        if settings.use_cache:
            window = self._cache_window()
            total = n + settings.max_new_tokens
            cache = KVCache(n_layers, min(total, window) if window else total, cross_capacity)
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

    def _cache_window(self) -> int | None:
        return next(m.variant.cache_window for m in self.modules() if isinstance(m, SelfAttention))


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
        return self.head(self.encode(tokens, padding_mask))  # (B, n, vocab)

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
        return self.head(self.decoder(tokens, Positions.of(tokens, padding_mask)))  # (B, n, vocab)

    def generate(self, prompt: Tensor, max_new_tokens: int = 32, strategy: str = "greedy",
                 temperature: float = 1.0, top_k: int | None = None, top_p: float | None = None,
                 eos_id: int | None = None, pad_id: int = 0, use_cache: bool = True,
                 padding_mask: Tensor | None = None, generator: torch.Generator | None = None) -> Tensor:
        """Continue `prompt` [B, n] (left-padded when rows differ in length; `padding_mask`
        marks real tokens). Returns [B, n + new]; rows that emitted `eos_id` continue with
        `pad_id`. `strategy` is "greedy" or "sample" (temperature, top_k, top_p)."""

        def step(tokens: Tensor, seq: Positions, cache: KVCache | None) -> Tensor:
            return self.head(self.decoder(tokens, seq, cache=cache))

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
        return self.head(hidden)  # (B, n_tgt, vocab)

    def generate(self, src: Tensor, max_new_tokens: int = 32, strategy: str = "greedy",
                 temperature: float = 1.0, top_k: int | None = None, top_p: float | None = None,
                 eos_id: int | None = None, pad_id: int = 0, use_cache: bool = True,
                 src_padding_mask: Tensor | None = None, bos_id: int = 1,
                 generator: torch.Generator | None = None) -> Tensor:
        """Translate `src` [B, m]: the target starts with `bos_id`. Returns [B, 1 + new]."""
        memory, src_seq = self.encode(src, src_padding_mask)

        def step(tokens: Tensor, seq: Positions, cache: KVCache | None) -> Tensor:
            return self.head(self.decoder(tokens, seq, memory, src_seq, cache=cache))

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
