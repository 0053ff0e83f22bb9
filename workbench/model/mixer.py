"""Token mixers: the attention sublayer of a layer, as a whole.

The attention axis takes two kinds of variant:

- a *kernel* (workbench.model.attention.AttentionVariant: full, sliding_window, sparse, naive):
  q, k, v in, one call, out per head. The model wraps it in its standard self-attention layer
  (workbench.model.transformer.SelfAttention: projections, the position scheme, the KV cache,
  the output projection, and the options every kernel takes: QK-norm, output gate, value
  residual). This is the short path, and what the built-in kernels use.
- a *mixer* (TokenMixer, this module): the layer's whole token mixer. It receives the layer's
  input and owns its projections, applies the position scheme where its reference does, knows
  its layer (index and the stack's depth), keeps its own cache for decoding, and may read and
  leave values for later layers of the same forward (`state`). Differential attention,
  multi-head latent attention and linear-time mixers are mixers. A mixer that changes one step of
  standard attention subclasses SelfAttention and overrides that step (`project`, `attend`,
  `output`).

A mixer is built once per layer:

    mixer = cls(params, spec=spec, layer=layer, position=position)

    spec      the whole ModelSpec (d_model, n_heads, n_kv_heads, head_dim, bias, dropout, norm eps, ...)
    layer     Layer: its 0-based index in its stack, and Depth (the stacks' depths, which one holds it)
    position  the position scheme this layer uses (shared with the other layers that use the same one):
              call position.rotate(q, k, q_pos, k_pos) on queries and keys, read position.score_bias
              when position.has_score_bias; `embed` was already applied to the stack's input.

and called at every forward of its layer:

    y = mixer(x, seq, causal=causal, cache=cache, state=state)     # [B, n, d_model]

    x       [B, n, d_model], the layer input after the norm placement's `before`
    seq     Positions: pos [B, n] (counted from each row's first real token), mask [B, n] (True for
            real tokens) or None (all real)
    causal  whether a query may read later positions (False in an encoder)
    cache   None while training; during generation the object this mixer's `new_cache(capacity)`
            made for the layer (its first call is the prompt, then one call per new token)
    state   a dict shared by the layers of one stack for one forward (a new one at every call,
            decoding steps included): values a layer leaves for later layers (value residual's
            first-layer values), by a name the mixer chooses

A cached forward must equal the full forward (the contract tests check every registered mixer).
Auxiliary losses and statistics go through workbench.model.losses (`add_loss`, `record`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from torch import Tensor, nn

from workbench.model.cache import LayerCache
from workbench.model.residual import Depth
from workbench.variants import Params, Variant


@dataclass(frozen=True)
class Layer:
    """Where a sublayer sits: its 0-based index in its stack, and the stacks' depths."""

    index: int
    depth: Depth

    @property
    def count(self) -> int:
        """Layers in this layer's stack."""
        return self.depth.layers


class TokenMixer(Variant, nn.Module):
    """An attention variant that is its layer's whole token mixer (see the module docstring)."""

    axis = "attention"
    Params = Params
    # The weights that write into the residual stream (workbench.model.residual): the init scales
    # them by depth. A mixer whose output projection is not `out` names its own.
    residual_outputs: ClassVar[tuple[str, ...]] = ("out.weight",)

    def __init__(self, params: Params, *, spec: Any, layer: Layer, position: nn.Module):
        super().__init__()
        self.params = params
        self.layer = layer

    @property
    def cache_window(self) -> int | None:
        """How many most recent positions decoding must keep (None: all)."""
        return None

    def new_cache(self, capacity: int) -> Any:
        """The cache of this layer for one generation of at most `capacity` tokens: by default
        keys and values (LayerCache), the last `cache_window` of them when the mixer has one.
        A mixer that caches something else (a latent, a recurrent state) returns its own object,
        with `empty` (nothing cached yet) and `nbytes` (bytes held)."""
        window = self.cache_window
        return LayerCache(min(capacity, window) if window else capacity)

    def cache_bytes(self, tokens: int, batch: int, element: int) -> int:
        """Bytes its cache holds after `tokens` tokens of `batch` rows, `element` bytes a number:
        the formula that `new_cache`'s measured `nbytes` is checked against."""
        raise NotImplementedError(f"{type(self).__name__} does not state the size of its cache")

    def forward(self, x: Tensor, seq: Any, *, causal: bool, cache: Any = None,
                state: dict[str, Any] | None = None) -> Tensor:
        raise NotImplementedError
