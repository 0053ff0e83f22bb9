"""`workbench list` shows every axis, every variant, its parameters with defaults and the
package it comes from; `--json` carries the same for machines."""

from __future__ import annotations

import json
from importlib.metadata import version

import pytest
from click.testing import CliRunner

from workbench.cli import main
from workbench.registry import variants
from workbench.variants import AXES

BUILTIN_PACKAGE = f"transformer-workbench {version('transformer-workbench')}"


def invoke(*args: str, columns: int = 200):
    result = CliRunner().invoke(main, ["list", *args], env={"COLUMNS": str(columns)})
    assert result.exit_code == 0, result.output
    return result.output


def test_json_lists_every_variant_of_every_axis_with_its_declared_parameters():
    rows = json.loads(invoke("--json"))
    by_key = {(r["axis"], r["name"]): r for r in rows}
    assert len(by_key) == len(rows), "a variant is listed twice"
    for axis in AXES:
        assert {name for a, name in by_key if a == axis} == set(variants(axis)), axis
        for name, cls in variants(axis).items():
            row = by_key[(axis, name)]
            assert row["summary"] == cls.summary()
            if cls.__module__.startswith("workbench_plugins."):
                assert row["package"] == BUILTIN_PACKAGE
            fields = cls.Params.model_fields
            assert [p["name"] for p in row["parameters"]] == list(fields)
            for p in row["parameters"]:
                field = fields[p["name"]]
                assert p["help"] == field.description
                assert p["required"] == field.is_required()
                if not field.is_required():
                    assert p["default"] == json.loads(json.dumps(field.default, default=str))


def test_json_shows_known_defaults():
    rows = {(r["axis"], r["name"]): r for r in json.loads(invoke("--json"))}
    defaults = {(a, n): {p["name"]: p["default"] for p in r["parameters"]} for (a, n), r in rows.items()}
    assert defaults[("position", "rope")]["base"] == 10000.0
    assert defaults[("position", "learned")]["max_len"] == 1024
    assert defaults[("norm", "pre")]["type"] == "layernorm"
    assert defaults[("attention", "full")]["scaled"] is True
    assert defaults[("ffn", "swiglu")]["d_ff"] is None


@pytest.mark.parametrize("axis", AXES)
def test_one_axis_filters_the_listing(axis):
    rows = json.loads(invoke(axis, "--json"))
    assert {r["axis"] for r in rows} <= {axis}
    assert sorted(r["name"] for r in rows) == sorted(variants(axis))


def test_table_shows_every_axis_variant_parameter_default_and_package():
    out = invoke()
    for axis in AXES:
        assert f"({axis})" in out, f"no table for axis {axis}"
        for name, cls in variants(axis).items():
            assert name in out
            for p in cls.declared_parameters():
                assert p["name"] in out
                if not p["required"]:
                    assert repr(p["default"]) in out, (axis, name, p)
    assert BUILTIN_PACKAGE in out


def test_names_and_packages_are_never_cut_in_a_narrow_terminal():
    out = invoke("position", columns=80)
    assert BUILTIN_PACKAGE in out
    for name in variants("position"):
        assert f" {name} " in out


def test_unknown_axis_is_a_usage_error():
    result = CliRunner().invoke(main, ["list", "positions"])
    assert result.exit_code == 2
    assert "position" in result.output


def test_a_piped_listing_cuts_no_name_at_80_columns():
    """Piped, rich lays the table out at 80 columns: every variant and parameter name is still
    there whole (folded text may wrap, nothing ends in an ellipsis)."""
    output = invoke(columns=80)
    assert "…" not in output
    words = set(output.replace("│", " ").split())
    for axis in AXES:
        for name, cls in variants(axis).items():
            assert name in words, name
            for parameter in cls.Params.model_fields:
                assert f"{parameter}:" in words, (name, parameter)
