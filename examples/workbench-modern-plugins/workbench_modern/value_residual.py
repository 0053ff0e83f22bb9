"""Value residual learning (Zhou et al. 2025, "Value Residual Learning", ResFormer): the first
layer's values reach every later layer's attention, V'_l = lambda_1 V_l + lambda_2 V_1, here with
both lambdas learned per layer from 0.5 (their "learnable" variant). The first layer leaves V_1 in
the forward's `state`, the dict the workbench shares between the layers of one forward (also one
decoding step: V_1 of the new tokens, while the cache keeps each layer's mixed values)."""

import torch
from torch import nn

from workbench import hookimpl
from workbench.model.attention import AttentionParams
from workbench.model.transformer import SelfAttention

KEY = "workbench_modern.first_values"


class ValueResidualAttention(SelfAttention):
    """Attention whose values mix in the first layer's (ResFormer, learnable lambdas)."""

    name = "value_residual_attention"
    Params = AttentionParams

    def __init__(self, params, *, spec, layer, position):
        super().__init__(params, spec=spec, layer=layer, position=position)
        self.first = layer.index == 0
        self.value_lambdas = None if self.first else nn.Parameter(torch.full((2,), 0.5))

    def project(self, x, state):
        q, k, v = super().project(x, state)
        if self.first:
            state[KEY] = v
            return q, k, v
        return q, k, self.value_lambdas[0] * v + self.value_lambdas[1] * state[KEY]


@hookimpl
def register_attention_variants():
    return [ValueResidualAttention]
