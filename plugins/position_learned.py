"""Learned absolute position embeddings (GPT-2, BERT): a table of max_len vectors.

Scale: as nanoGPT's wpe and wte, the table and the token embeddings both start N(0, 0.02)
(`model.Transformer._init_weights`), so positions and tokens start at equal RMS at every width.
"""

from pydantic import Field
from torch import Tensor, nn

from workbench import hookimpl
from workbench.model.position import PositionScheme
from workbench.variants import Params


class LearnedParams(Params):
    max_len: int = Field(1024, gt=0, description="rows in the table; longer inputs are not applicable")


class Learned(PositionScheme):
    """A trained embedding per position, added to the token embeddings."""

    name = "learned"
    Params = LearnedParams
    picture_note = "what training made of the table"

    def __init__(self, params: LearnedParams, **dims):
        super().__init__(params, **dims)
        self.table = nn.Embedding(params.max_len, self.d_model)

    @property
    def max_length(self) -> int:
        return self.params.max_len

    def embed(self, x: Tensor, pos: Tensor) -> Tensor:
        return x + self.table(pos)


@hookimpl
def register_position_schemes():
    return [Learned]
