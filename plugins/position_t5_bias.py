"""T5's relative position bias (Raffel et al. 2020, section 2.1): no position embedding; each
head adds a learned scalar to its attention scores, looked up by the bucket of the offset
between key and query. Offsets below num_buckets / 4 (bidirectional; / 2 causal) get a bucket
each, larger ones share logarithmically wider buckets up to max_distance, beyond which all
offsets share the last bucket. Bidirectional stacks (encoders) give earlier and later keys
separate halves of the buckets; causal stacks (decoders) bucket only the distance to earlier
keys. As in T5, one table serves every layer of a stack (the encoder and the decoder each
have their own), and cross-attention has none.

Follows Hugging Face transformers' `T5Attention._relative_position_bucket` exactly (tests
compare buckets and logits, tests/model/test_hf_parity.py). Deviation: the table starts N(0, 0.02)
like every matrix here (`model.Transformer._init_weights`); T5 starts it N(0, d_model^-0.5).
"""

import math

import torch
from pydantic import Field, model_validator
from torch import Tensor, nn

from workbench import hookimpl
from workbench.model.position import PositionScheme
from workbench.variants import Params


class T5BiasParams(Params):
    num_buckets: int = Field(32, ge=4, description="learned biases per head (T5: 32); bidirectional stacks "
                             "spend half on earlier and half on later keys")
    max_distance: int = Field(128, gt=0, description="offsets from here on share the last bucket (T5: 128)")

    @model_validator(mode="after")
    def _logarithmic_range(self):
        if self.max_distance <= self.num_buckets // 2:  # the exact buckets of a causal stack reach num_buckets / 2
            raise ValueError(f"max_distance={self.max_distance} must exceed num_buckets / 2 = {self.num_buckets // 2} "
                             "(the offsets bucketed exactly)")
        return self


def relative_position_bucket(relative_position: Tensor, bidirectional: bool, num_buckets: int,
                             max_distance: int) -> Tensor:
    """Bucket of each offset key_pos - query_pos (integer tensor, any shape): HF's
    `T5Attention._relative_position_bucket`, line for line."""
    buckets = torch.zeros_like(relative_position)
    if bidirectional:
        num_buckets //= 2
        buckets += (relative_position > 0).long() * num_buckets  # later keys: the upper half
        relative_position = relative_position.abs()
    else:
        relative_position = -relative_position.clamp(max=0)  # distance to earlier keys; later ones: 0
    max_exact = num_buckets // 2  # half of the buckets: exact offsets
    is_small = relative_position < max_exact
    # the other half: logarithmically wider bins up to max_distance (float32 as in T5)
    if_large = max_exact + (torch.log(relative_position.float() / max_exact) / math.log(max_distance / max_exact)
                            * (num_buckets - max_exact)).long()
    if_large = if_large.clamp(max=num_buckets - 1)
    return buckets + torch.where(is_small, relative_position, if_large)


class T5Bias(PositionScheme):
    """Learned bias per head on attention scores by bucketed offset (T5), shared across layers."""

    name = "t5_bias"
    Params = T5BiasParams
    has_score_bias = True
    picture_note = ("one learned value per bucket of the offset: a band per offset near the diagonal, logarithmically "
                    "wider bands farther away, constant past max_distance; a decoder's only look back")

    def __init__(self, params: T5BiasParams, **dims):
        super().__init__(params, **dims)
        self.table = nn.Embedding(params.num_buckets, self.n_heads)  # T5's relative_attention_bias

    def buckets(self, rel: Tensor) -> Tensor:
        """rel = q_pos - k_pos (any shape) -> bucket ids; T5's offset is key minus query."""
        return relative_position_bucket(-rel, not self.causal, self.params.num_buckets, self.params.max_distance)

    def score_bias(self, rel: Tensor) -> Tensor:
        """rel [B, 1 or h, ...] -> [B, h, ...]: head j's bias at its bucket of rel[:, j] (or rel[:, 0])."""
        n_buckets = self.params.num_buckets
        heads = torch.arange(self.n_heads, device=rel.device).view(1, -1, *(1,) * (rel.dim() - 2))
        return self.table.weight.T.reshape(-1)[heads * n_buckets + self.buckets(rel)]  # table [h, buckets] flat


@hookimpl
def register_position_schemes():
    return [T5Bias]
