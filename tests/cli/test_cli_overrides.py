"""`--set KEY=VALUE` changes a study exactly like editing the file; `--dry-run` lists every
run id with its resolved settings and trains nothing."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from workbench.cli import main
from workbench.errors import WorkbenchError
from workbench.run.runner import check_study
from workbench.run.store import Store
from workbench.study import load_study
from workbench.recipes.train.sweep import expand

STUDY = """\
name: t
task: {name: copy, train_length: 8, n_eval: 16, alphabet_size: 8}
model: {family: decoder, d_model: 32, n_layers: 1, n_heads: 2, position: rope}
train: {steps: 20, batch_size: 8}
seeds: [0, 1]
sweep: {model.position: [none, rope]}
"""


def write(tmp_path: Path, text: str = STUDY, name: str = "study.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


@pytest.mark.parametrize("override,edit", [
    ("train.steps=500", ("steps: 20", "steps: 500")),
    ("model.d_model=64", ("d_model: 32", "d_model: 64")),
    ("seeds=[3]", ("seeds: [0, 1]", "seeds: [3]")),
    ("sweep.model.position=[alibi, rope]", ("[none, rope]", "[alibi, rope]")),
    ("model.attention={name: sliding_window, window: 4}", ("position: rope}", "position: rope, attention: {name: sliding_window, window: 4}}")),
])
def test_an_override_hashes_like_the_same_edit_of_the_file(tmp_path, override, edit):
    plain = load_study(write(tmp_path))
    overridden = load_study(write(tmp_path), overrides=[override])
    edited = load_study(write(tmp_path, STUDY.replace(*edit), "edited.yaml"))
    assert overridden.study_hash == edited.study_hash != plain.study_hash
    assert [r.run_id for r in expand(overridden)] == [r.run_id for r in expand(edited)]
    assert overridden.overrides == (override,)


def test_an_override_of_a_folder_refuses_to_mix_with_earlier_results(tmp_path):
    store = Store(tmp_path / "out")
    check_study(store, load_study(write(tmp_path)))
    with pytest.raises(WorkbenchError, match=r"train.steps: 20 -> 500"):
        check_study(store, load_study(write(tmp_path), overrides=["train.steps=500"]))
    assert store.study_info()["overrides"] == "[]"


@pytest.mark.parametrize("override,fragments", [
    ("train.steps=abc", ["study.yaml with --set: train.steps", "valid integer", "'abc'"]),
    ("train.stpes=5", ["study.yaml with --set: train.stpes: unknown key", "did you mean 'steps'"]),
    ("steps", ["--set: expected KEY=VALUE", "'steps'"]),
    ("sweep.model.position=[rope, alibbi]", ["sweep.model.position", "unknown position scheme 'alibbi'"]),
])
def test_a_bad_override_is_one_line_naming_it(tmp_path, override, fragments):
    result = CliRunner().invoke(main, ["validate", str(write(tmp_path)), "--set", override])
    assert result.exit_code == 2, result.output
    assert len(result.stderr.strip().splitlines()) == 1
    for fragment in fragments:
        assert fragment in result.stderr, (fragment, result.stderr)


def test_validate_and_dry_run_apply_the_overrides(tmp_path):
    path = write(tmp_path)
    result = CliRunner().invoke(main, ["validate", str(path), "--set", "train.steps=500", "--set", "seeds=[0]"])
    assert result.exit_code == 0 and "2 runs = 2 sweep points x 1 seeds" in result.output and "500 steps" in result.output
    result = CliRunner().invoke(main, ["run", str(path), "--dry-run", "--set", "train.steps=500",
                                       "--out", str(tmp_path / "out")])
    assert result.exit_code == 0, result.output
    runs = expand(load_study(path, overrides=["train.steps=500"]))
    lines = result.output.splitlines()
    assert lines[0].startswith(f"t: 4 runs (study hash {load_study(path, overrides=['train.steps=500']).study_hash})")
    assert "  train.steps = 500" in lines and "  model.d_model = 32" in lines
    listed = [line for line in lines if not line.startswith(("t:", "settings", "  "))]
    assert [line.split()[0] for line in listed] == [r.run_id for r in runs]
    assert 'model.position.name="none"' in listed[0] and "seed=0" in listed[0] and "seed=1" in listed[1]
    assert not (tmp_path / "out").exists()  # nothing trained, no store written


def test_a_dry_run_prints_each_runs_own_parameters_and_no_other_variants_as_null(tmp_path):
    """A learned table has max_len, RoPE has none: RoPE's runs do not list model.position.max_len=null."""
    path = write(tmp_path, STUDY.replace("[none, rope]", "[rope, {name: learned, max_len: 32}]"))
    result = CliRunner().invoke(main, ["run", str(path), "--dry-run", "--out", str(tmp_path / "out")])
    assert result.exit_code == 0, result.output
    listed = [line for line in result.output.splitlines() if 'model.position.name=' in line]
    assert len(listed) == 4 and not any("null" in line for line in listed)
    assert all(("model.position.max_len=32" in line) == ('"learned"' in line) for line in listed)


def test_validate_says_when_the_seeds_are_too_few_to_decide_an_entry(tmp_path):
    expecting = STUDY + "expect:\n  - {metric: accuracy@8, better: rope, than: none}\n"
    result = CliRunner().invoke(main, ["validate", str(write(tmp_path, expecting))])
    assert result.exit_code == 0 and "note: at most 2 seeds per group: a verdict needs 4" in result.output
    result = CliRunner().invoke(main, ["validate", str(write(tmp_path, expecting.replace("[0, 1]", "[0, 1, 2, 3]")))])
    assert result.exit_code == 0 and "note:" not in result.output


# ---- issue 40: a value given with --set is read under a study file's limits -----------------

ALIAS_BOMB = "{" + ", ".join(["a: &a [" + ", ".join(["lol"] * 9) + "]"] + [
    f"{c}: &{c} [" + ", ".join([f"*{p}"] * 9) + "]" for p, c in zip("abcdefgh", "bcdefghi")]) + "}"


@pytest.mark.parametrize("override, message", [
    (f"notes={ALIAS_BOMB}", r"--set notes: its YAML aliases \(\*name\) expand to 4\.9e\+08 nodes, over the limit"),
    (f"profiles={{gpu: {ALIAS_BOMB}}}", r"--set profiles: its YAML aliases \(\*name\) expand to"),
    ("notes=" + "[" * 60_000, r"--set notes: its YAML is nested too deeply"),
    ("notes=&p {b: *p}", r"--set notes: malformed YAML: a YAML alias \(\*name\) at line 1 refers to a value that holds it"),
    ("train.steps=0x_", r"--set train.steps: '0x_' reads as a YAML number but is not one"),
    ("notes=2001-02-30", r"--set notes: '2001-02-30' reads as a YAML date but is not one \(day is out of range"),
    ("notes=a: b: c", r"--set notes: malformed YAML: mapping values are not allowed here"),
])
def test_a_set_value_is_refused_in_one_line_before_it_expands(tmp_path, override, message):
    result = CliRunner().invoke(main, ["validate", str(write(tmp_path)), "--set", override])
    assert result.exit_code == 2 and len(result.output.splitlines()) == 1, result.output
    assert re.search(message, result.output), result.output


def test_narrowing_a_sweep_leaves_out_the_expect_entries_it_orphans_naming_each(tmp_path):
    """`--set 'sweep.model.n_kv_heads=[4, 1]'` on a study that compares 2 with 1: that entry (and
    a baseline on 2) has nothing to compare, so it is left out with one warning line each; the
    entries the narrowed sweep still serves stay."""
    text = STUDY.replace("n_heads: 2", "n_heads: 4").replace("sweep: {model.position: [none, rope]}",
                         "sweep: {model.n_kv_heads: [4, 2, 1]}\nbaseline: 2\nexpect:\n"
                         "  - {metric: accuracy@8, better: 4, than: 1}\n"
                         "  - {metric: accuracy@8, better: 2, than: 1}\n"
                         "  - {metric: accuracy@8, better: {model.n_kv_heads: 4}, than: {model.n_kv_heads: 2}}\n")
    path = write(tmp_path, text)
    result = CliRunner().invoke(main, ["validate", str(path), "--set", "sweep.model.n_kv_heads=[4, 1]"])
    assert result.exit_code == 0, result.output
    warned = [line for line in result.stderr.splitlines() if "no longer swept" in line]
    assert len(warned) == 3, result.stderr
    assert "expect.1 (2 better than 1 on accuracy@8) compares n_kv_heads=2" in warned[0]
    assert "expect.2 ({model.n_kv_heads: 4} better than {model.n_kv_heads: 2}" in warned[1]
    assert "baseline n_kv_heads=2" in warned[2]
    study = load_study(path, overrides=["sweep.model.n_kv_heads=[4, 1]"]).study
    assert [(e.better, e.than) for e in study.expect] == [({"model.n_kv_heads": 4}, {"model.n_kv_heads": 1})]
    assert study.baseline is None
    assert len(load_study(path).study.expect) == 3  # the file itself keeps every entry
