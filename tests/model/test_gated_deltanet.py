"""Gated DeltaNet (plugins/attention_gated_deltanet.py) against the formula of its paper: the
chunkwise form equals the recurrence, the recurrence is the gated delta rule as Yang et al. write
it, the cache holds a constant number of bytes, padding is a no-op, the encoder form runs both
directions; and a hybrid pattern (three DeltaNet layers to one gated attention layer, as
Qwen3-Next) builds, trains through the runner and decodes with its cache as its forward. Layer
parity with Hugging Face: tests/model/test_hf_parity_qwen3_next.py; cached == full for every
family and position scheme: the registry-parametrized contract tests."""

from __future__ import annotations

import pytest
import torch
from torch.testing import assert_close

from conftest import build, check_greedy_decoding, generate, incremental_logits, tiny_spec, tokens
from workbench.errors import SpecError
from workbench.recipes.train.sweep import expand
from workbench.run.train import train_run
from workbench.study import load_study
from workbench.model.transformer import Positions
from workbench_plugins.attention_gated_deltanet import chunked_delta_rule, l2_normalise, recurrent_delta_rule

TIGHT = dict(atol=1e-5, rtol=1e-5)


def delta_rule_inputs(B=2, H=3, n=37, dk=8, dv=5, seed=0):
    gen = torch.Generator().manual_seed(seed)

    def draw(*shape):
        return torch.randn(*shape, generator=gen, dtype=torch.float64)

    q = l2_normalise(draw(B, H, n, dk)) * dk**-0.5
    k = l2_normalise(draw(B, H, n, dk))
    g = -torch.rand(B, H, n, generator=gen, dtype=torch.float64) * 3  # decays from 1 down to e^-3
    beta = torch.rand(B, H, n, generator=gen, dtype=torch.float64)
    return q, k, draw(B, H, n, dv), g, beta, draw(B, H, dk, dv)


def test_the_recurrence_is_the_gated_delta_rule_of_the_paper():
    """S_t = a_t (I - b_t k_t k_t^T) S_{t-1} + b_t k_t v_t^T, o_t = S_t^T q_t (Yang et al. 2025, eq. 10)."""
    q, k, v, g, beta, S0 = delta_rule_inputs(B=1, H=1, n=9)
    S, expected = S0[0, 0], []
    eye = torch.eye(8, dtype=torch.float64)
    for t in range(9):
        k_t, b_t = k[0, 0, t], beta[0, 0, t]
        S = g[0, 0, t].exp() * (eye - b_t * torch.outer(k_t, k_t)) @ S + b_t * torch.outer(k_t, v[0, 0, t])
        expected.append(S.T @ q[0, 0, t])
    out, final = recurrent_delta_rule(q, k, v, g, beta, S0)
    assert_close(out[0, 0], torch.stack(expected), atol=1e-12, rtol=1e-12)
    assert_close(final[0, 0], S, atol=1e-12, rtol=1e-12)


@pytest.mark.parametrize("chunk", [1, 4, 8, 37, 64])
@pytest.mark.parametrize("initial", [False, True])
def test_the_chunkwise_form_equals_the_recurrence(chunk, initial):
    """37 tokens: whole chunks, a padded tail, one chunk longer than the sequence; from zeros or a state."""
    q, k, v, g, beta, S0 = delta_rule_inputs()
    S0 = S0 if initial else None
    out, final = chunked_delta_rule(q, k, v, g, beta, S0, chunk)
    expected, expected_final = recurrent_delta_rule(q, k, v, g, beta, S0)
    assert_close(out, expected, atol=1e-12, rtol=1e-12)
    assert_close(final, expected_final, atol=1e-12, rtol=1e-12)


def test_the_chunkwise_form_stays_finite_under_strong_decay():
    """Decays near 0 over a long chunk (g down to -40 per token, Qwen3-Next's A up to 16): every
    exponent the chunkwise form takes is <= 0, so nothing overflows to inf or nan."""
    q, k, v, g, beta, _ = delta_rule_inputs(n=64)
    out, final = chunked_delta_rule(q, k, v, g * 13, beta, None, 64)
    expected, _ = recurrent_delta_rule(q, k, v, g * 13, beta, None)
    assert torch.isfinite(out).all() and torch.isfinite(final).all()
    assert_close(out, expected, atol=1e-10, rtol=1e-10)


def deltanet(**params):
    return {"name": "gated_deltanet", **params}


def test_the_chunk_size_changes_no_output_or_gradient():
    small, large = (build(tiny_spec(n_layers=2, attention=deltanet(chunk_size=c))).double() for c in (3, 64))
    x = tokens(2, 11)
    outputs = []
    for model in (small, large):
        logits = model(x)
        logits.square().mean().backward()
        outputs.append((logits.detach(), {n: p.grad for n, p in model.named_parameters()}))
    assert_close(outputs[0][0], outputs[1][0], atol=1e-12, rtol=1e-12)
    for name, grad in outputs[0][1].items():
        assert_close(grad, outputs[1][1][name], atol=1e-12, rtol=1e-12)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_cache_holds_the_same_bytes_whatever_the_length(dtype):
    """Each layer: value_heads * key_dim * value_dim state numbers (float32 at least) and channels
    * (conv_size - 1) convolution inputs per sequence: 4 * 8 * 8 * 4 + (2*4*8 + 4*8) * 3 * element."""
    spec = tiny_spec(n_layers=2, attention=deltanet(key_dim=8, value_dim=8))
    model = build(spec).to(dtype)
    element = torch.empty((), dtype=dtype).element_size()
    sizes = []
    for prompt, new in ((3, 2), (12, 9)):
        generate(model, tokens(3, prompt), new, use_cache=True)
        sizes.append(model.last_cache.nbytes)
        assert sizes[-1] == sum(b.attn.cache_bytes(prompt + new, 3, element) for b in model.decoder.blocks)
    assert sizes[0] == sizes[1] == 2 * 3 * (4 * 8 * 8 * 4 + (2 * 4 * 8 + 4 * 8) * 3 * element)


def test_a_left_padded_row_equals_that_row_alone_across_chunks():
    """Chunks of 2 and a convolution of 4: five padding tokens span chunks and the first real
    tokens' convolution windows; none of them reaches a real token's output."""
    model = build(tiny_spec(n_layers=2, attention=deltanet(chunk_size=2))).double()
    x = tokens(2, 12)
    mask = torch.ones(2, 12, dtype=torch.bool)
    mask[1, :5] = False
    with torch.no_grad():
        padded = model(x, padding_mask=mask)
        alone = model(x[1:, 5:])
        garbage = model(torch.where(mask, x, (x + 7) % 30 + 2), padding_mask=mask)  # other padding ids
    assert_close(padded[1, 5:], alone[0], atol=1e-12, rtol=1e-12)
    assert_close(garbage[mask], padded[mask], atol=1e-12, rtol=1e-12)


def test_the_encoder_form_reads_both_directions_with_the_same_weights():
    """Forward and reversed scans summed: reversing the input reverses the output, and the first
    token's output reads the last token."""
    mixer = build(tiny_spec("encoder", attention=deltanet(chunk_size=4))).double().encoder.blocks[0].attn
    x = torch.randn(2, 10, 16, dtype=torch.float64)
    seq = Positions(torch.arange(10).expand(2, 10), None)
    with torch.no_grad():
        mixer.A_log.fill_(-3.0)  # slow decay (the init's A up to 16 forgets within a token or two)
        y = mixer(x, seq, causal=False)
        assert_close(mixer(x.flip(1), seq, causal=False), y.flip(1), atol=1e-12, rtol=1e-12)
        changed = x.clone()
        changed[:, -1] += 1.0
        assert (mixer(changed, seq, causal=False)[:, 0] - y[:, 0]).abs().max() > 1e-3 * y.abs().max()
        assert_close(mixer(changed, seq, causal=True)[:, :-1], mixer(x, seq, causal=True)[:, :-1])


def test_value_heads_must_be_a_multiple_of_key_heads():
    with pytest.raises(SpecError) as err:
        build(tiny_spec(attention=deltanet(key_heads=2, value_heads=3)))
    assert err.value.field == "model.attention.value_heads"


HYBRID = {"repeat": [deltanet(chunk_size=4)] * 3 + [{"name": "full", "qk_norm": "head", "gate": "elementwise"}]}


def test_a_hybrid_pattern_decodes_with_its_caches_as_its_forward():
    """Qwen3-Next's layout: three Gated DeltaNet layers to one gated attention layer (partial RoPE):
    each layer keeps its own cache, the DeltaNet ones constant, the attention one growing."""
    model = build(tiny_spec(n_layers=4, n_kv_heads=2, attention=HYBRID,
                            position={"name": "rope", "fraction": 0.5}))
    assert [type(b.attn).__name__ for b in model.decoder.blocks] == ["GatedDeltaNet"] * 3 + ["SelfAttention"]
    x = tokens(2, 7)
    with torch.no_grad():
        assert_close(incremental_logits(model, x, prefill=3), model(x), **TIGHT)
    check_greedy_decoding(model, x, max_new_tokens=8)
    generate(model, x, 5, use_cache=True)
    sizes = [layer.nbytes for layer in model.last_cache.self_attn]
    assert sizes[:3] == [b.attn.cache_bytes(12, 2, 4) for b in model.decoder.blocks[:3]]
    assert sizes[3] == 2 * 2 * 4 * 12 * 2 * 4  # K and V, 2 K/V heads of 4, 12 tokens, 2 rows, float32


def test_a_hybrid_pattern_trains_through_the_runner(tmp_path):
    study = tmp_path / "hybrid.yaml"
    study.write_text(
        "name: hybrid\n"
        "task: {name: copy, train_length: 8, n_eval: 16, alphabet_size: 8}\n"
        "model: {family: decoder, d_model: 16, n_layers: 4, n_heads: 2, n_kv_heads: 1,\n"
        "        position: {name: rope, fraction: 0.5},\n"
        "        attention: {repeat: [gated_deltanet, gated_deltanet, gated_deltanet,\n"
        "                             {name: full, qk_norm: head, gate: elementwise}]}}\n"
        "train: {steps: 12, batch_size: 8, log_every: 4, eval_every: 6}\n"
        "seeds: [0]\n")
    run = expand(load_study(study))[0]
    result = train_run(run.run_id, run.config, tmp_path / "run")
    assert result.status == "finished", result.error
    losses = [v for _, split, m, v in result.curves if split == "train" and m == "loss"]
    assert losses[-1] < losses[0]
    assert "accuracy@8" in result.metrics
