"""QK-norm before RoPE (Dehghani et al. 2023; as OLMo 2, Qwen3 and Gemma 3 place it): queries and
keys are RMS-normalised per head, each with a learned gain of head_dim, before the position scheme
rotates them. A mixer that changes one step of standard attention: it subclasses the workbench's
SelfAttention and overrides `project`, which returns the heads before the rotation."""

from pydantic import Field
from torch import nn

from workbench import hookimpl
from workbench.model.attention import AttentionParams
from workbench.model.transformer import SelfAttention


class QKNormParams(AttentionParams):
    eps: float = Field(1e-6, gt=0, description="added to the mean square of each head")


class QKNormAttention(SelfAttention):
    """Attention whose queries and keys are RMS-normalised per head before RoPE (QK-norm)."""

    name = "qk_norm_attention"
    Params = QKNormParams

    def __init__(self, params, *, spec, layer, position):
        super().__init__(params, spec=spec, layer=layer, position=position)
        self.query_norm = nn.RMSNorm(self.head_dim, eps=params.eps)
        self.key_norm = nn.RMSNorm(self.head_dim, eps=params.eps)

    def project(self, x, state):
        q, k, v = super().project(x, state)  # (B, h, n, hd), (B, h_kv, n, hd) x2: not rotated yet
        return self.query_norm(q), self.key_norm(k), v


@hookimpl
def register_attention_variants():
    return [QKNormAttention]
