"""Sandwich norm (Gemma 2 and Gemma 3; Ding et al. 2021, CogView's "Sandwich-LN"): a norm on
the sublayer's input and another on its output, before the residual add,
x + norm_out(f(norm_in(x))); the stack ends with a final norm. Hugging Face's Gemma2/Gemma3
layers: input_layernorm and post_attention_layernorm around attention, pre_feedforward_layernorm
and post_feedforward_layernorm around the MLP. Gemma's RMSNorm scales by (1 + w) with w from 0,
ours by w from 1: the same function (tests/model/test_hf_parity.py maps w + 1)."""

from torch import Tensor

from workbench import hookimpl
from workbench.model.norm import NormPlacement, make_norm


class SandwichNorm(NormPlacement):
    """Normalise the sublayer's input and its output: x + norm'(f(norm(x)))."""

    name = "sandwich"
    final_norm = True

    def __init__(self, params, *, d_model: int):
        super().__init__(params, d_model=d_model)
        self.output_norm = make_norm(params, d_model)

    def before(self, x: Tensor) -> Tensor:
        return self.norm(x)

    def output(self, y: Tensor) -> Tensor:
        return self.output_norm(y)


@hookimpl
def register_norm_placements():
    return [SandwichNorm]
