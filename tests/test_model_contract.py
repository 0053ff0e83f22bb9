"""Contract tests parametrized over the registry (timm-style): every registered variant of
every axis builds, runs forward and backward, keeps its documented shapes and parameter
counts, and composes with every other variant. A new plugin is covered without new tests.
"""

from __future__ import annotations

import itertools
import time

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch.testing import assert_close

from conftest import (
    FAMILIES,
    GENERATIVE,
    VOCAB,
    build,
    check_causal,
    check_greedy_decoding,
    choice,
    generate,
    logits_of,
    build_or_refuse,
    registered,
    registered_kernels,
    tiny_spec,
    tokens,
    train_step,
)
from workbench.model.ffn import MLP, GatedMLP
from workbench.model.position import PositionScheme
from workbench.model.transformer import Positions, build_model
from workbench.model.weights import SkipInitialisers
from workbench.registry import variants
from workbench.variants import MODEL_AXES

AXIS_VARIANTS = [(axis, name) for axis in MODEL_AXES for name in registered(axis)]


# ---- every variant: builds, forward/backward finite, shapes --------------------------------


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("axis,name", AXIS_VARIANTS, ids=[f"{a}={n}" for a, n in AXIS_VARIANTS])
def test_variant_forward_backward_finite_with_documented_shapes(axis, name, family):
    model = build(tiny_spec(family, n_layers=2, n_kv_heads=2, **{axis: choice(axis, name)}))
    model.train()
    B, n = 2, 11
    x = tokens(B, n)
    mask = torch.ones(B, n, dtype=torch.bool)
    mask[0, -3:] = False  # one padded row: the masked path runs too
    masks = {"src_padding_mask": mask} if family == "encoder_decoder" else {"padding_mask": mask}
    logits = logits_of(model, x, **masks)
    assert logits.shape == (B, n, VOCAB)
    assert torch.isfinite(logits).all()
    for module in model.modules():  # nn.Module API intact on variants (optimizers, summaries)
        assert all(isinstance(p, torch.nn.Parameter) for p in module.parameters())
    logits.float().logsumexp(-1).mean().backward()
    for pname, p in model.named_parameters():
        assert p.grad is not None, f"{pname} gets no gradient: is the module wired into forward?"
        assert torch.isfinite(p.grad).all(), f"non-finite gradient in {pname}"


@pytest.mark.parametrize("family", GENERATIVE)
@pytest.mark.parametrize("axis,name", AXIS_VARIANTS, ids=[f"{a}={n}" for a, n in AXIS_VARIANTS])
def test_variant_keeps_future_tokens_out_of_past_outputs(axis, name, family):
    check_causal(build(tiny_spec(family, n_layers=2, **{axis: choice(axis, name)})))


@pytest.mark.parametrize("axis,name", AXIS_VARIANTS, ids=[f"{a}={n}" for a, n in AXIS_VARIANTS])
def test_variant_encoder_classifies_padded_batches(axis, name):
    model = build(tiny_spec("encoder", n_classes=3, **{axis: choice(axis, name)}))
    x = tokens(2, 9)
    mask = torch.ones(2, 9, dtype=torch.bool)
    mask[1, 5:] = False
    with torch.no_grad():
        scores = model.classify(x, padding_mask=mask)
        alone = model.classify(x[1:, :5])
    assert scores.shape == (2, 3) and torch.isfinite(scores).all()
    assert_close(scores[1:], alone, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("axis", MODEL_AXES)
def test_every_variant_documents_itself(axis):
    """`workbench list` and reports read these: a summary line and a help per parameter."""
    for name, cls in variants(axis).items():
        assert cls.name == name and cls.axis == axis
        assert cls.summary(), f"{axis} {name!r} has no docstring summary"
        for row in cls.declared_parameters():
            assert row["help"], f"{axis} {name!r} parameter {row['name']!r} has no description"
        cls.Params()  # every parameter has a default: a bare name selects the variant


# ---- attention variants: fast path == the dense reference --------------------------------

BIAS_SCHEMES = [None] + [p for p, cls in variants("position").items() if cls.has_score_bias]


def attention_inputs(B: int, n: int, g: int, padding: str | None, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(B, 4, n, 8, generator=gen, requires_grad=True)
    k = torch.randn(B, g, n, 8, generator=gen, requires_grad=True)
    v = torch.randn(B, g, n, 8, generator=gen, requires_grad=True)
    mask = None
    if padding is not None:
        mask = torch.ones(B, n, dtype=torch.bool)
        cut = slice(0, 4) if padding == "left" else slice(n - 4, n)
        mask[1, cut] = False
    seq = Positions.of(torch.zeros(B, n, dtype=torch.long), mask)
    return q, k, v, seq


@pytest.mark.parametrize("bias", BIAS_SCHEMES)
@pytest.mark.parametrize("padding", [None, "left", "right"])
@pytest.mark.parametrize("g", [4, 2, 1])
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("name", registered_kernels())
def test_attention_forward_and_gradients_equal_the_dense_reference(name, causal, g, padding, bias):
    cls = variants("attention")[name]
    params = cls.Params.model_validate({k: v for k, v in choice("attention", name).items() if k != "name"})
    variant = cls(params, n_heads=4, n_kv_heads=g, head_dim=8)
    score_bias = None
    if bias is not None:
        scheme = variants("position")[bias](variants("position")[bias].Params(), d_model=32, n_heads=4, head_dim=8)
        score_bias = scheme.score_bias
    B, n = 2, 13  # not a multiple of any tiny block or window: blocked paths pad their tail
    q, k, v, seq = attention_inputs(B, n, g, padding)
    real = seq.mask if seq.mask is not None else torch.ones(B, n, dtype=torch.bool)
    kwargs = dict(q_pos=seq.pos, k_pos=seq.pos, key_mask=seq.mask, causal=causal, score_bias=score_bias)

    outputs, grads = [], []
    for path in (variant.forward, variant.dense):
        out = path(q, k, v, **kwargs)
        out = out * real[:, None, :, None]  # padding queries' outputs are nobody's business
        (out * torch.linspace(-1, 1, 8)).sum().backward()
        outputs.append(out.detach())
        grads.append([t.grad.clone() for t in (q, k, v)])
        for t in (q, k, v):
            t.grad = None
    assert out.shape == (B, 4, n, 8)
    assert_close(outputs[0], outputs[1], atol=1e-5, rtol=1e-5)
    for fast, ref in zip(*grads):
        assert_close(fast, ref, atol=1e-5, rtol=1e-5)

    if causal:  # one decoding step: the last query reads the whole sequence as its cache
        last = seq.pos[:, -1:]
        step = dict(kwargs, q_pos=last)
        assert_close(variant(q[:, :, -1:], k, v, **step), variant.dense(q[:, :, -1:], k, v, **step),
                     atol=1e-5, rtol=1e-5)


def recorded_offsets(name: str, causal: bool) -> list[torch.Tensor]:
    """Every `rel` the attention variant `name` hands a score bias (ALiBi's, recording)."""
    cls = variants("attention")[name]
    params = cls.Params.model_validate({k: v for k, v in choice("attention", name).items() if k != "name"})
    variant = cls(params, n_heads=4, n_kv_heads=2, head_dim=8)
    alibi = variants("position")["alibi"](variants("position")["alibi"].Params(), d_model=32, n_heads=4, head_dim=8)
    seen = []

    def recording(rel):
        seen.append(rel.detach().clone())
        return alibi.score_bias(rel)

    q, k, v, seq = attention_inputs(2, 13, 2, "left")
    variant(q, k, v, q_pos=seq.pos, k_pos=seq.pos, key_mask=seq.mask, causal=causal, score_bias=recording)
    return seen


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("name", registered_kernels())
def test_every_attention_variant_passes_score_bias_the_documented_offsets(name, causal):
    """PositionScheme.score_bias's contract: rel is integer offsets [B', H, ...] with B' in
    (1, B) and H in (1, h); the docstring names the head axis every built-in passes."""
    seen = recorded_offsets(name, causal)
    assert seen, f"{name} never called score_bias"
    for rel in seen:
        assert not rel.is_floating_point() and rel.dim() >= 3, rel.shape
        assert rel.shape[0] in (1, 2) and rel.shape[1] in (1, 4), rel.shape
        if rel.shape[1] == 4:
            assert "H = 1 or h" in PositionScheme.score_bias.__doc__  # the contract says heads may arrive apart


@pytest.mark.parametrize("bias", BIAS_SCHEMES[1:])
def test_every_score_bias_keeps_its_heads_apart_on_any_offsets_shape(bias):
    """The shapes of the contract, each answered with [B', h, ...]: one head axis of 1 broadcast
    to every head, or h heads each with its own offsets (sparse attention's layout)."""
    cls = variants("position")[bias]
    scheme = cls(cls.Params(), d_model=32, n_heads=4, head_dim=8)
    rel = torch.arange(-6, 7).view(1, 1, 13)  # every offset the shapes below draw
    shared = scheme.score_bias(rel)
    assert shared.shape == (1, 4, 13)
    for shape in [(2, 1, 3, 4), (1, 1, 3, 2, 2), (1, 4, 3, 2, 2)]:
        offsets = torch.randint(-6, 7, shape)
        bias_of = scheme.score_bias(offsets)
        assert bias_of.shape == (shape[0], 4, *shape[2:]), shape
        for head in range(4):
            own = offsets[:, head] if shape[1] == 4 else offsets[:, 0]
            expected = shared[0, head][own + 6]  # the head's bias at each of its offsets
            assert_close(bias_of[:, head], expected)


# ---- documented parameter counts ----------------------------------------------------------

TWO_LAYER_FFNS = [n for n, c in variants("ffn").items() if issubclass(c, (MLP, GatedMLP))]


@pytest.mark.parametrize("d", [16, 30, 96, 100])
@pytest.mark.parametrize("name", TWO_LAYER_FFNS)
def test_ffn_default_width_matches_the_4x_mlp_parameter_count(name, d):
    cls = variants("ffn")[name]
    ffn = cls(cls.Params(), d_model=d, bias=False)
    count = sum(p.numel() for p in ffn.parameters())
    assert abs(count - 8 * d * d) <= 0.01 * 8 * d * d, (count, 8 * d * d)
    hidden = ffn.down.in_features
    assert hidden == (round(8 * d / 3) if issubclass(cls, GatedMLP) else 4 * d)


@pytest.mark.parametrize("name", TWO_LAYER_FFNS)
def test_ffn_width_is_overridable(name):
    cls = variants("ffn")[name]
    ffn = cls(cls.Params(d_ff=40), d_model=16, bias=True)
    matrices = 3 if issubclass(cls, GatedMLP) else 2
    assert sum(p.numel() for p in ffn.parameters()) == matrices * 16 * 40 + (matrices - 1) * 40 + 16


def test_decoder_parameter_count_is_the_sum_of_its_parts():
    V, d, h, g, L, max_len = VOCAB, 16, 4, 2, 3, 64
    hd = d // h
    model = build(tiny_spec(n_layers=L, n_kv_heads=g, position={"name": "learned", "max_len": max_len},
                            ffn="swiglu", norm={"name": "pre", "type": "rmsnorm"}))
    attention = d * (h + 2 * g) * hd + h * hd * d
    ffn = 3 * d * round(8 * d / 3)
    norms = 2 * d  # RMSNorm: a weight, no bias
    expected = V * d + max_len * d + L * (attention + ffn + norms) + d  # final norm
    assert model.num_parameters() == expected


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("axis,name", AXIS_VARIANTS, ids=[f"{a}={n}" for a, n in AXIS_VARIANTS])
def test_meta_device_count_without_initialisers_equals_the_built_model(axis, name, family):
    # load_final_model's guard against a stored config that asks for a huge model counts this way
    spec = tiny_spec(family, **{axis: choice(axis, name)})
    with torch.device("meta"), SkipInitialisers():
        counted = build_model(spec)
    assert all(p.is_meta for p in counted.parameters())
    assert counted.num_parameters() == build(spec).num_parameters()


@pytest.mark.parametrize("family", FAMILIES)
def test_tie_embeddings_shares_one_matrix(family):
    tied = build(tiny_spec(family))
    untied = build(tiny_spec(family, tie_embeddings=False))
    assert tied.head.weight is tied.embedding.weight
    assert untied.head.weight is not untied.embedding.weight
    assert untied.num_parameters() - tied.num_parameters() == VOCAB * 16
    stacks = [getattr(tied, s) for s in ("encoder", "decoder") if hasattr(tied, s)]
    assert all(s.embedding.weight is tied.embedding.weight for s in stacks)  # one vocabulary


# ---- hypothesis: random combinations of every axis ----------------------------------------


@st.composite
def model_specs(draw):
    family = draw(st.sampled_from(FAMILIES))
    n_kv_heads = draw(st.sampled_from([4, 2, 1]))
    residual = draw(st.sampled_from(registered("residual")))
    placement = variants("residual")[residual].norm_placement  # DeepNorm is defined with Post-Norm only
    norm = {"name": placement or draw(st.sampled_from(registered("norm"))),
            "type": draw(st.sampled_from(["layernorm", "rmsnorm"]))}
    return tiny_spec(
        family,
        position=draw(st.sampled_from(registered("position"))),
        attention=draw(st.sampled_from(registered("attention"))),
        ffn=draw(st.sampled_from(registered("ffn"))),
        residual=residual,
        norm=norm,
        n_kv_heads=n_kv_heads,
        n_layers=draw(st.integers(1, 2)),
        bias=draw(st.booleans()),
        tie_qk=n_kv_heads == 4 and draw(st.booleans()),
        tie_embeddings=draw(st.booleans()),
    )


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(spec=model_specs(), n=st.integers(2, 9), seed=st.integers(0, 2**16))
def test_random_combination_trains_and_decodes_consistently(spec, n, seed):
    model = build_or_refuse(spec, seed=seed)  # or refused in one line naming the field it cannot take
    if model is None:
        return
    x = tokens(2, n, seed=seed)
    train_step(model, x)
    if spec["family"] in GENERATIVE:
        check_greedy_decoding(model, x, max_new_tokens=6)


# ---- issue 2 "Done when": every combination of the registered variants --------------------

DONE_WHEN_FFNS = [f for f in registered("ffn") if f != "none"]  # the 4 FFNs (+ any new)


@pytest.mark.parametrize("attention", registered("attention"))
@pytest.mark.parametrize("family", FAMILIES)
def test_every_combination_builds_trains_and_decodes_identically_with_and_without_cache(family, attention):
    """{positions} x {attention} x {MHA, GQA, MQA} x {pre, post} x {FFNs}, one family and
    attention variant per test item (so pytest -n spreads them); failures are collected and
    reported together rather than stopping at the first."""
    combos = list(itertools.product(registered("position"), [4, 2, 1], registered("norm"), DONE_WHEN_FFNS))
    x = tokens(2, 3, seed=1) % 16
    failures, refused = [], 0
    start = time.perf_counter()
    for position, g, norm, ffn in combos:
        spec = tiny_spec(family, vocab_size=16, d_model=8, position=position, attention=attention,
                         n_kv_heads=g, norm=norm, ffn=ffn)
        try:
            model = build_or_refuse(spec)  # or refused in one line naming the field it cannot take
            if model is None:
                refused += 1
                continue
            train_step(model, x)
            if family in GENERATIVE:
                cached, uncached = (generate(model, x, 3, use_cache=c) for c in (True, False))
                assert torch.equal(cached, uncached), f"cached {cached.tolist()} != uncached {uncached.tolist()}"
        except Exception as err:  # collect, so one run lists every broken combination
            failures.append(f"{position}/{attention}/kv={g}/{norm}/{ffn}: {type(err).__name__}: {err}")
    elapsed = time.perf_counter() - start
    assert not failures, f"{len(failures)} of {len(combos)} combinations failed:\n" + "\n".join(failures)
    assert refused < len(combos), f"{attention} refused every combination"
    print(f"{family}/{attention}: {len(combos)} combinations ({refused} refused) in {elapsed:.2f}s")
