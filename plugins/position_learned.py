"""Learned absolute position embeddings (GPT-2, BERT): a table of max_len vectors.

Scale: the table is an embedding layer like the token embedding and is treated the same way,
Vaswani et al. 3.4 with fairseq's init: N(0, d_model^-0.5) (see `Transformer._init_weights`),
multiplied by sqrt(d_model). Positions and tokens thus start at equal RMS, as GPT-2's wpe and
wte (both N(0, 0.02)) do. `scaled: false` adds the raw table, as fairseq's
LearnedPositionalEmbedding does: d_model^-0.5 times the tokens' RMS (an ablation).
"""

import math

from pydantic import Field
from torch import Tensor, nn

from workbench import hookimpl
from workbench.position import PositionScheme
from workbench.variants import Params


class LearnedParams(Params):
    max_len: int = Field(1024, gt=0, description="rows in the table; longer inputs are not applicable")
    scaled: bool = Field(True, description="multiply the table by sqrt(d_model) as the token embedding is, so both "
                         "start at the same RMS; false (ablation): the raw table, d_model^-0.5 of the tokens")


class Learned(PositionScheme):
    """A trained embedding per position, added to the token embeddings."""

    name = "learned"
    Params = LearnedParams

    def __init__(self, params: LearnedParams, **dims):
        super().__init__(params, **dims)
        self.table = nn.Embedding(params.max_len, self.d_model)
        self.table_scale = math.sqrt(self.d_model) if params.scaled else 1.0

    @property
    def max_length(self) -> int:
        return self.params.max_len

    def embed(self, x: Tensor, pos: Tensor) -> Tensor:
        return x + self.table(pos) * self.table_scale


@hookimpl
def register_position_schemes():
    return [Learned]
