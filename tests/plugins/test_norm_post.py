"""Our Post-Norm decoder against PyTorch's reference Post-LN layer.

`torch.nn.TransformerEncoderLayer(norm_first=False)` with a causal mask is the original
Transformer's block (Vaswani et al. 2017): x = norm1(x + attn(x)); x = norm2(x + ffn(x)), and
`nn.TransformerEncoder(norm=None)` ends without a final norm. With the same weights (every
matrix, bias, LayerNorm gain and shift set at random, not left at their init) and dropout 0,
our decoder's logits must equal the reference's: token embedding (+ learned positions) ->
the reference layers -> the tied head.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.testing import assert_close

from conftest import VOCAB, build, tiny_spec, tokens

D_MODEL, N_HEADS, N_LAYERS, N = 16, 4, 2, 10


def randomise(model: nn.Module, layer_norm_shift: bool) -> None:
    """Every parameter away from its init (norm gains off 1, shifts off 0), so a swapped or
    missing norm, bias or projection shows in the output."""
    torch.manual_seed(1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1 + 0.3 * torch.randn_like(p))
            elif name.endswith("norm.bias"):
                p.copy_(0.3 * torch.randn_like(p) if layer_norm_shift else torch.zeros_like(p))
            else:
                p.copy_(0.3 * torch.randn_like(p))


def reference_layers(model, activation: str, bias: bool, norm_first: bool) -> nn.TransformerEncoder:
    """nn.TransformerEncoder holding our decoder blocks' weights, layer by layer."""
    layer = nn.TransformerEncoderLayer(D_MODEL, N_HEADS, dim_feedforward=4 * D_MODEL, dropout=0.0,
                                       activation=activation, batch_first=True, norm_first=norm_first, bias=bias)
    reference = nn.TransformerEncoder(layer, N_LAYERS, norm=None, enable_nested_tensor=False).eval()
    with torch.no_grad():
        for ours, ref in zip(model.decoder.blocks, reference.layers, strict=True):
            # our qkv stacks q, k, v rows in that order, as in_proj_weight does; heads are
            # contiguous slices of each in both
            pairs = [(ours.attn.qkv, ref.self_attn, "in_proj_"), (ours.attn.out, ref.self_attn.out_proj, ""),
                     (ours.ffn.up, ref.linear1, ""), (ours.ffn.down, ref.linear2, ""),
                     (ours.attn_norm.norm, ref.norm1, ""), (ours.ffn_norm.norm, ref.norm2, "")]
            for src, dst, prefix in pairs:
                getattr(dst, prefix + "weight").copy_(src.weight)
                if getattr(dst, prefix + "bias", None) is not None:
                    getattr(dst, prefix + "bias").copy_(src.bias)
    return reference


def reference_logits(model, reference: nn.TransformerEncoder, ids: torch.Tensor) -> torch.Tensor:
    x = model.embedding(ids)  # (B, n, d)
    if hasattr(model.decoder.position, "table"):  # learned positions: added to the embeddings
        x = x + model.decoder.position.table.weight[: ids.shape[1]]
    causal = nn.Transformer.generate_square_subsequent_mask(ids.shape[1])
    return reference(x, mask=causal, is_causal=True) @ model.embedding.weight.T  # tied head


def post_norm_decoder(position: str, ffn: str, bias: bool):
    model = build(tiny_spec("decoder", d_model=D_MODEL, n_heads=N_HEADS, n_layers=N_LAYERS, norm="post",
                            position=position, ffn=ffn, bias=bias))
    randomise(model, layer_norm_shift=bias)  # the reference's LayerNorms have a shift only with bias=True
    return model


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("ffn", ["gelu", "relu"])
@pytest.mark.parametrize("position", ["none", "learned"])
def test_post_norm_decoder_equals_torch_post_ln_layers(position, ffn, bias):
    model = post_norm_decoder(position, ffn, bias)
    reference = reference_layers(model, activation=ffn, bias=bias, norm_first=False)
    ids = tokens(3, N)
    with torch.no_grad():
        ours = model(ids)  # (B, n, VOCAB)
        expected = reference_logits(model, reference, ids)
    assert ours.shape == (3, N, VOCAB)
    assert_close(ours, expected, atol=2e-5, rtol=2e-5)


def test_the_comparison_tells_post_from_pre_ln():
    """The same weights in a Pre-LN reference (norm_first=True) give other logits, so the test
    above would fail if our Post-Norm block normalised before its sublayers or added a final norm."""
    model = post_norm_decoder("learned", "gelu", bias=True)
    reference = reference_layers(model, activation="gelu", bias=True, norm_first=True)
    ids = tokens(3, N)
    with torch.no_grad():
        gap = (model(ids) - reference_logits(model, reference, ids)).abs().max()
    assert gap > 0.1
