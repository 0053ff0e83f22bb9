"""Head similarity (claim E13): Jensen-Shannon divergence between heads' attention maps."""

import numpy as np
import pytest
import torch

from workbench.recipes.train.report.pictures import head_divergence, head_similarity_items, js_divergence


def test_js_divergence_bounds():
    p = torch.tensor([0.5, 0.5, 0.0])
    assert float(js_divergence(p, p)) == pytest.approx(0.0)
    assert float(js_divergence(torch.tensor([1.0, 0.0]), torch.tensor([0.0, 1.0]))) == pytest.approx(1.0)
    # half overlap: JS(0.5/0.5/0 || 0/0.5/0.5) = 0.5 bit
    assert float(js_divergence(p, torch.tensor([0.0, 0.5, 0.5]))) == pytest.approx(0.5)


def test_head_divergence_finds_the_redundant_pair():
    eye = torch.eye(4)  # each query reads itself
    prev = torch.roll(eye, 1, dims=1)  # each query reads its neighbour: disjoint from eye
    weights = torch.stack([eye, prev, eye])  # heads 0 and 2 identical
    div = head_divergence(weights)
    assert div.shape == (3, 3)
    np.testing.assert_allclose(np.diag(div), 0, atol=1e-6)
    np.testing.assert_allclose(div, div.T, atol=1e-6)
    assert div[0, 2] == pytest.approx(0.0, abs=1e-6) and div[0, 1] == pytest.approx(1.0)


def test_table_per_layer_uses_real_lengths():
    eye, uniform = torch.eye(3), torch.full((3, 3), 1 / 3)
    padded = torch.zeros(2, 5, 5)  # 2 heads, padded to 5: only the first 3 rows/keys are real
    padded[0, :3, :3], padded[1, :3, :3] = eye, uniform
    recorded = {"decoder.blocks.1.attn": [padded[None]], "decoder.blocks.0.attn": [torch.stack([eye, eye])[None]]}
    [table] = head_similarity_items(recorded, {"encoder": 3, "decoder": 3}, "run")
    assert [r[0] for r in table.rows] == ["decoder.blocks.0.attn", "decoder.blocks.1.attn"]
    assert table.rows[0][2] == "0"  # identical heads
    # JS(one-hot || uniform over 3) = (1 - 0.5*log2(3)... ) computed independently:
    m = (eye[0] + uniform[0]) / 2
    expected = 0.5 * (float((eye[0][eye[0] > 0] * torch.log2(eye[0][eye[0] > 0] / m[eye[0] > 0])).sum())
                      + float((uniform[0] * torch.log2(uniform[0] / m)).sum()))
    assert float(table.rows[1][2]) == pytest.approx(expected, rel=1e-2)
