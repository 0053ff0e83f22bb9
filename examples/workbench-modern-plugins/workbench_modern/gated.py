"""Head-wise gated attention (Qiu et al. 2025, "Gated Attention for Large Language Models:
Non-linearity, Sparsity, and Attention-Sink-Free", their G1 position, head-specific gates): each
head's attention output is multiplied by sigmoid(x W_g), one score per head computed from the
layer input x (after the block's norm), before the output projection. A SelfAttention subclass
that overrides `output`, which receives the heads and the layer input."""

import torch
from torch import nn

from workbench import hookimpl
from workbench.model.attention import AttentionParams
from workbench.model.transformer import SelfAttention


class HeadGatedAttention(SelfAttention):
    """Attention with one sigmoid gate per head, computed from the layer input (Qiu et al. 2025)."""

    name = "gated_attention"
    Params = AttentionParams

    def __init__(self, params, *, spec, layer, position):
        super().__init__(params, spec=spec, layer=layer, position=position)
        self.head_gate = nn.Linear(spec.d_model, self.n_heads, bias=True)

    def output(self, y, x):
        B, h, n, _ = y.shape
        scores = torch.sigmoid(self.head_gate(x)).transpose(1, 2)[..., None]  # (B, h, n, 1)
        return super().output(y * scores, x)


@hookimpl
def register_attention_variants():
    return [HeadGatedAttention]
