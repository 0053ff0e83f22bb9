"""Invalid model specs raise one error type, SpecError, whose message names the field."""

from __future__ import annotations

import pytest

from conftest import tiny_spec
from workbench import build_model
from workbench.errors import SpecError, WorkbenchError
from workbench.registry import variants


def spec_error(**overrides) -> SpecError:
    with pytest.raises(SpecError) as info:
        build_model(tiny_spec(**overrides))
    assert isinstance(info.value, WorkbenchError)  # the CLI's one-line, exit-2 path
    return info.value


def test_n_heads_must_divide_d_model():
    err = spec_error(d_model=16, n_heads=3)
    assert err.field == "model.n_heads"
    assert "16" in str(err) and "model.n_heads" in str(err)


def test_an_explicit_head_dim_lifts_the_divisibility_rule():
    model = build_model(tiny_spec(d_model=16, n_heads=3, head_dim=4))
    assert model.decoder.blocks[0].attn.qkv.out_features == (3 + 2 * 3) * 4


@pytest.mark.parametrize("n_kv_heads", [3, 8])
def test_n_kv_heads_must_divide_n_heads(n_kv_heads):
    err = spec_error(n_heads=4, n_kv_heads=n_kv_heads)
    assert err.field == "model.n_kv_heads"
    assert "valid: 1, 2, 4" in str(err)


@pytest.mark.parametrize(
    "axis,typo,closest",
    [("position", "rop", "rope"), ("attention", "ful", "full"), ("ffn", "swiglo", "swiglu"), ("norm", "pree", "pre")],
)
def test_unknown_variant_lists_the_registered_names_and_suggests_the_closest(axis, typo, closest):
    err = spec_error(**{axis: typo})
    assert err.field == f"model.{axis}"
    message = str(err)
    assert f"did you mean {closest!r}" in message
    for name in variants(axis):
        assert name in message
    assert err.choices == sorted(variants(axis))


def test_unknown_variant_in_a_mapping_is_reported_the_same_way():
    err = spec_error(position={"name": "rop", "base": 500.0})
    assert err.field == "model.position" and "did you mean 'rope'" in str(err)


def test_unrelated_name_gets_no_suggestion_but_the_list():
    err = spec_error(attention="zzzzzz")
    assert "did you mean" not in str(err) and "full" in str(err)


def test_bad_parameter_type_names_the_parameter():
    err = spec_error(position={"name": "rope", "base": "abc"})
    assert err.field == "model.position.base"
    assert "'abc'" in str(err)


def test_out_of_range_parameter_names_the_parameter():
    err = spec_error(position={"name": "learned", "max_len": 0})
    assert err.field == "model.position.max_len"


def test_unknown_parameter_key_names_the_key():
    err = spec_error(position={"name": "rope", "bsae": 500.0})
    assert err.field == "model.position.bsae"
    assert "unknown key" in str(err)


def test_variant_mapping_needs_a_name():
    err = spec_error(attention={"window": 4})
    assert err.field == "model.attention" and "name" in str(err)


def test_unknown_top_level_key_names_the_key():
    err = spec_error(n_layer=3)
    assert err.field == "model.n_layer"
    assert "unknown key" in str(err)


@pytest.mark.parametrize(
    "field,value",
    [("d_model", "wide"), ("d_model", 0), ("family", "gpt"), ("dropout", 1.5), ("vocab_size", 1)],
)
def test_bad_top_level_values_name_the_field(field, value):
    err = spec_error(**{field: value})
    assert err.field == f"model.{field}"


def test_tied_qk_needs_as_many_kv_heads_as_heads():
    err = spec_error(tie_qk=True, n_kv_heads=2)
    assert err.field == "model.tie_qk"


def test_only_the_encoder_has_a_classifier():
    err = spec_error(family="decoder", n_classes=3)
    assert err.field == "model.n_classes"


def test_rope_needs_an_even_head_dim():
    err = spec_error(position="rope", d_model=12, n_heads=4)  # head_dim 3
    assert err.field == "model.head_dim"


# ---- issue 40: whole numbers are strict and bounded, floats finite, in every study section ------

STUDY = """\
name: t
task: {name: copy, train_length: 8, n_eval: 16, alphabet_size: 8}
model: {family: decoder, d_model: 32, n_layers: 1, n_heads: 2, position: rope}
train: {steps: 20, batch_size: 8}
seeds: [0]
"""


@pytest.mark.parametrize("line, message", [
    ("train: {steps: true, batch_size: 8}", "train.steps: expected a whole number, got true (a boolean)"),
    (f"train: {{steps: {'9' * 4000}, batch_size: 8}}",
     "train.steps: a number of 4000 digits is too large (at most 9223372036854775807)"),
    ("train: {steps: 20, batch_size: 8, lr: .inf}", "train.lr: Input should be a finite number (got inf)"),
    ("model: {family: decoder, d_model: true, n_layers: 1, n_heads: 2, position: rope}",
     "model.d_model: expected a whole number, got true (a boolean)"),
    ("model: {family: decoder, d_model: 32, n_layers: 1, n_heads: 2, attention: {name: sliding_window, window: false}}",
     "model.attention.window: expected a whole number, got false (a boolean)"),
    ("task: {name: copy, train_length: true, n_eval: 16, alphabet_size: 8}",
     "task.train_length: expected a whole number, got true (a boolean)"),
    ("seeds: [0, true]", "seeds: expected a whole number, got true (a boolean)"),
])
def test_a_boolean_huge_or_infinite_number_is_refused_at_validate_naming_the_field(tmp_path, line, message):
    from click.testing import CliRunner

    from workbench.cli import main

    section = line.split(":")[0]
    text = "\n".join(line if row.startswith(section + ":") else row for row in STUDY.splitlines())
    path = tmp_path / "study.yaml"
    path.write_text(text + "\n")
    result = CliRunner().invoke(main, ["validate", str(path)])
    assert result.exit_code == 2 and message in result.output and len(result.output.splitlines()) == 1, result.output


@pytest.mark.parametrize("text, message", [
    ("name: x\ndate: 2001-02-30\n", "study.yaml:2: '2001-02-30' reads as a YAML date but is not one (day is out of range"),
    ("name: x\ndate: 2001-13-01\n", "study.yaml:2: '2001-13-01' reads as a YAML date but is not one (month must be"),
    ("name: x\nseeds: 0b_\n", "study.yaml:2: '0b_' reads as a YAML number but is not one"),
    ("name: x\nseeds: 0x_\n", "study.yaml:2: '0x_' reads as a YAML number but is not one"),
    ("name: x\nkind: [1]\n", "study.yaml:2: kind: unknown study kind [1]"),
    ("a: &p {b: *p}\n", "a YAML alias (*name) at line 1 refers to a value that holds it"),
])
def test_yaml_that_cannot_build_is_one_line(tmp_path, text, message):
    from workbench.study import load_study

    path = tmp_path / "study.yaml"
    path.write_text(text)
    with pytest.raises(WorkbenchError) as info:
        load_study(path)
    assert message in str(info.value) and "\n" not in str(info.value)
