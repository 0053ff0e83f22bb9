"""Residual connections: how each sublayer's output joins the residual stream.

Block.forward writes every sublayer (self-attention, cross-attention, FFN) the same way, with
the norm placement (workbench.model.norm) around it:

    x = residual.add(x, f(placement.before(x)))      add(x, y) = skip(x) + branch(y)
    x = placement.after(x)

    plain:       x + f(x)              (the Transformer, GPT-2; `add` is torch.add: no hook runs)
    layerscale:  x + diag(lambda) f(x) (Touvron et al. 2021)
    rezero:      x + alpha f(x)        (Bachlechner et al. 2020)
    deepnorm:    LN(alpha x + f(x))    (Wang et al. 2022; with norm: post)

A connection may also set the initial scale of its sublayer's weights (`init_branch`). Each
sublayer names its matrices that write into the residual stream (`residual_outputs`, a role,
not a parameter name): the model's init scales those by depth, as GPT-2 does, unless the
connection sets their scale itself (`depth_scaled_init = False`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from torch import Tensor, nn

from workbench.model.spec import ModelSpec
from workbench.variants import Params, Variant


@dataclass(frozen=True)
class Depth:
    """Where a block sits: the depth of each stack of its model, and which stack holds it."""

    encoder_layers: int  # 0 in a decoder-only model
    decoder_layers: int  # 0 in an encoder-only model
    in_decoder: bool

    @classmethod
    def of(cls, spec: ModelSpec, in_decoder: bool) -> Depth:
        return cls(encoder_layers=0 if spec.family == "decoder" else spec.encoder_layers,
                   decoder_layers=0 if spec.family == "encoder" else spec.decoder_layers, in_decoder=in_decoder)

    @property
    def layers(self) -> int:
        """Blocks in this block's stack."""
        return self.decoder_layers if self.in_decoder else self.encoder_layers


class Residual(Variant, nn.Module):
    """How one sublayer's output y = f(...) joins the stream x: skip(x) + branch(y), both the
    identity by default. One instance per sublayer of each block, so each holds its own
    parameters (LayerScale's lambda, ReZero's alpha)."""

    axis = "residual"
    # The norm placement (model.norm) the connection is defined with; the spec refuses another.
    # None: any placement.
    norm_placement: ClassVar[str | None] = None
    # Whether the sublayer's residual outputs start at GPT-2's depth-scaled std (False: the
    # connection's init_branch sets their scale instead).
    depth_scaled_init: ClassVar[bool] = True

    def __init__(self, params: Params, *, d_model: int, depth: Depth):
        super().__init__()
        self.params = params

    def add(self, x: Tensor, y: Tensor) -> Tensor:
        """The stream after the sublayer: x, y [B, n, d_model] -> [B, n, d_model]."""
        return self.skip(x) + self.branch(y)

    def skip(self, x: Tensor) -> Tensor:
        """What the skip path carries of the stream x [B, n, d_model]."""
        return x

    def branch(self, y: Tensor) -> Tensor:
        """What joins the stream of the sublayer's output y [B, n, d_model]."""
        return y

    def init_branch(self, sublayer: nn.Module) -> None:
        """Called once the model's init has drawn every weight, with the sublayer this connection
        joins (its self- or cross-attention, or its FFN): re-scale its weights here."""


def residual_outputs(sublayer: nn.Module) -> list[nn.Parameter]:
    """The parameters a sublayer names in its `residual_outputs` (its matrices that write into
    the residual stream). TypeError naming the class when it names one it does not have."""
    try:
        return [sublayer.get_parameter(name) for name in sublayer.residual_outputs]
    except AttributeError as err:
        raise TypeError(f"{type(sublayer).__name__}.residual_outputs names a parameter it does not have "
                        f"({err}): list the names of its output projections' weights there") from None
