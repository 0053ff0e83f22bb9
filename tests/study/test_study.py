"""Study files: schema, sweep expansion, and one located message per kind of bad input.

No training here: every test runs in well under a second (one subprocess test aside).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import jsonschema
import pytest
import yaml
from click.testing import CliRunner
from conftest import run_within_cpu

from workbench.cli import main
from workbench.study import load_study
from workbench.recipes.train.sweep import expand, tuning_runs

STUDIES = Path(__file__).resolve().parents[2] / "studies"

BASE = """\
name: t
task: {name: copy, train_length: 8, n_eval: 16, alphabet_size: 8}
model:
  family: decoder
  d_model: 32
  n_layers: 1
  n_heads: 2
  position: rope
train: {steps: 20, batch_size: 8}
seeds: [0, 1]
"""


def write(tmp_path: Path, text: str, name: str = "study.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def validate(path: Path):
    return CliRunner().invoke(main, ["validate", str(path)])


# ---- expansion ------------------------------------------------------------------------------


def test_grid_times_zip_times_seeds(tmp_path):
    path = write(tmp_path, BASE + """\
sweep:
  model.position: [none, rope, {name: alibi}]
  zip:
    - {model.d_model: [32, 64], model.n_heads: [2, 4]}
""")
    runs = expand(load_study(path))
    assert len(runs) == 3 * 2 * 2
    assert len({r.run_id for r in runs}) == len(runs)
    first = runs[0]
    assert first.swept == {"model.position": "none", "model.d_model": 32, "model.n_heads": 2}
    # zipped keys vary together: never d_model 32 with 4 heads
    assert {(r.swept["model.d_model"], r.swept["model.n_heads"]) for r in runs} == {(32, 2), (64, 4)}
    # fully resolved: the task set vocab_size, variants carry every parameter
    cfg = first.config
    assert cfg["model"]["vocab_size"] == 4 + 8 and cfg["model"]["position"]["name"] == "none"
    assert cfg["train"]["steps"] == 20 and cfg["train"]["eval_every"] == 2 and cfg["seed"] == 0
    assert {r.seed for r in runs} == {0, 1}


def test_run_ids_are_stable_and_ignore_where_runs_execute(tmp_path):
    a = expand(load_study(write(tmp_path, BASE, "a.yaml")))
    b = expand(load_study(write(tmp_path, BASE.replace("batch_size: 8}", "batch_size: 8, accelerator: cpu}"), "b.yaml")))
    c = expand(load_study(write(tmp_path, BASE.replace("batch_size: 8}", "batch_size: 16}"), "c.yaml")))
    assert [r.run_id for r in a] == [r.run_id for r in b]
    assert not {r.run_id for r in a} & {r.run_id for r in c}


def test_tokens_budget_gives_equal_tokens_per_run(tmp_path):
    path = write(tmp_path, BASE.replace("steps: 20", "tokens: 10000") + "sweep: {train.batch_size: [8, 16]}\n")
    steps = [r.config["train"]["steps"] for r in expand(load_study(path))]
    assert steps == [157, 157, 79, 79]  # ceil(10000 / (batch * 8 positions))


def test_sweep_over_variant_parameter_and_profile(tmp_path):
    path = write(tmp_path, BASE + """\
sweep: {model.position.base: [100.0, 10000.0]}
profiles:
  big: {train.batch_size: 64, model.d_model: 64}
""")
    runs = expand(load_study(path))
    assert [r.config["model"]["position"]["base"] for r in runs[::2]] == [100.0, 10000.0]
    big = expand(load_study(path, profile="big"))
    assert big[0].config["train"]["batch_size"] == 64 and big[0].config["model"]["d_model"] == 64


def test_a_profile_can_replace_a_swept_list(tmp_path):
    path = write(tmp_path, BASE + """\
sweep: {model.position: [none, {name: learned, max_len: 16}]}
profiles:
  long: {task.train_length: 40, sweep.model.position: [none, {name: learned, max_len: 128}]}
""")
    tables = [r.config["model"]["position"].get("max_len") for r in expand(load_study(path, profile="long"))]
    assert tables == [None, None, 128, 128]
    assert load_study(path, profile="long").study_hash != load_study(path).study_hash


def test_a_profile_can_replace_zipped_lists_and_their_keys_are_checked(tmp_path):
    """A zip of a scheme and its rate is replaced whole by `sweep.zip` (a longer table at a longer
    length), and a key inside it that names no field is one located error, as anywhere else."""
    zipped = BASE + """\
sweep:
  zip: {model.position: [none, {name: learned, max_len: 16}], train.lr: [1.0e-3, 3.0e-3]}
profiles:
  long: {task.train_length: 40, sweep.zip: {model.position: [none, {name: learned, max_len: 128}], train.lr: [1.0e-3, 3.0e-3]}}
"""
    path = write(tmp_path, zipped)
    runs = expand(load_study(path, profile="long"))
    assert [(r.config["model"]["position"].get("max_len"), r.config["train"]["lr"]) for r in runs] == [
        (None, 1e-3), (None, 1e-3), (128, 3e-3), (128, 3e-3)]
    bad = write(tmp_path, zipped.replace("train.lr: [1.0e-3, 3.0e-3]}}", "train.lrr: [1.0e-3, 3.0e-3]}}"), "bad.yaml")
    result = validate(bad)
    assert result.exit_code == 2
    assert "profiles.long.sweep.zip.train.lrr" in result.stderr and "no such key 'train.lrr'" in result.stderr


def test_an_entry_naming_one_zipped_key_names_the_keys_zipped_with_it(tmp_path):
    """Each scheme at its own rate (a zip): `better: {model.position: rope}` is the point of rope and
    its rate, so its runs are found (like with like over the rate would pair none: no two schemes share
    one); a value two rows share leaves the rest to be compared like with like."""
    path = write(tmp_path, BASE + """\
sweep:
  zip: {model.position: [none, rope, alibi], train.lr: [1.0e-2, 3.0e-3, 3.0e-3]}
baseline: {model.position: none}
expect:
  - {metric: accuracy@8, better: {model.position: rope}, than: {model.position: none}}
  - {metric: accuracy@8, better: {train.lr: 3.0e-3}, than: {train.lr: 1.0e-2}}
""")
    study = load_study(path).study
    assert study.baseline == {"model.position": "none", "train.lr": 1e-2}
    assert study.expect[0].better == {"model.position": "rope", "train.lr": 3e-3}
    assert study.expect[0].than == {"model.position": "none", "train.lr": 1e-2}
    assert study.expect[1].better == {"train.lr": 3e-3} and study.expect[1].than == {"train.lr": 1e-2, "model.position": "none"}


def test_baseline_and_expectations_are_normalised(tmp_path):
    path = write(tmp_path, BASE + """\
sweep: {model.position: [none, rope]}
baseline: none
expect:
  - {metric: accuracy@8, better: rope, than: {name: none}, claim: P1}
""")
    study = load_study(path).study
    assert study.baseline == {"model.position": "none"}
    assert study.expect[0].better == {"model.position": "rope"}


def test_yaml_never_builds_python_objects(tmp_path):
    path = write(tmp_path, BASE.replace("name: t", "name: !!python/object/apply:os.system [echo hacked]"))
    result = validate(path)
    assert result.exit_code == 2 and "hacked" not in result.output


# ---- bad input: one line, file, field, YAML line, choices, exit 2 ---------------------------

BAD = {
    # case: (edit of BASE, expected line, fragments of the message)
    "unknown top-level key": (lambda t: t.replace("seeds:", "seed:"), 10, ["seed", "unknown key", "did you mean 'seeds'"]),
    "unknown train key": (lambda t: t.replace("steps: 20", "stpes: 20"), 9, ["train.stpes", "unknown key", "steps"]),
    "unknown variant": (lambda t: t.replace("position: rope", "position: rop"), 8,
                        ["model.position", "unknown position scheme 'rop'", "did you mean 'rope'", "alibi"]),
    "unknown task": (lambda t: t.replace("name: copy", "name: cpy"), 2, ["task.name", "unknown task 'cpy'", "copy"]),
    "wrong type": (lambda t: t.replace("batch_size: 8", "batch_size: big"), 9, ["train.batch_size", "integer", "'big'"]),
    "n_heads must divide d_model": (lambda t: t.replace("n_heads: 2", "n_heads: 3"), 7,
                                    ["model.n_heads", "do not divide d_model=32"]),
    "n_kv_heads must divide n_heads": (lambda t: t.replace("n_heads: 2", "n_heads: 4\n  n_kv_heads: 3"), 8,
                                       ["model.n_kv_heads", "must divide n_heads=4", "valid: 1, 2, 4"]),
    "sweep over a missing key": (lambda t: t + "sweep: {model.d_modle: [32, 64]}\n", 11,
                                 ["sweep.model.d_modle", "no such key", "did you mean 'model.d_model'"]),
    "empty sweep": (lambda t: t + "sweep:\n  model.position: []\n", 12, ["sweep.model.position", "empty sweep list"]),
    "bad value inside a sweep": (lambda t: t + "sweep:\n  model.position: [rope, alibbi]\n", 12,
                                 ["sweep.model.position", "unknown position scheme 'alibbi'", "model.position=alibbi"]),
    "swept combination invalid": (lambda t: t + "sweep: {model.d_model: [32, 33]}\n", 11,
                                  ["model.n_heads", "do not divide d_model=33", "model.d_model=33"]),
    "malformed YAML": (lambda t: t.replace("n_layers: 1", "n_layers: [1"), 7, ["malformed YAML"]),
    "duplicate key": (lambda t: t.replace("n_layers: 1", "n_layers: 1\n  n_layers: 2"), 7, ["model.n_layers", "duplicate key"]),
    "baseline not swept": (lambda t: t + "sweep: {model.position: [none, rope]}\nbaseline: alibi\n", 12,
                           ["baseline", "'alibi' is not a swept value", "none, rope"]),
    "expectation on an unknown metric": (
        lambda t: t + "sweep: {model.position: [none, rope]}\nexpect: [{metric: acuracy@8, better: rope, than: none}]\n",
        12, ["expect.0.metric", "unknown metric 'acuracy'", "did you mean 'accuracy'"]),
    "typo in a swept variant, spelled right in expect": (
        lambda t: t + "sweep:\n  model.position: [rope, alibbi]\nexpect: [{metric: accuracy@8, better: alibi, than: rope}]\n",
        12, ["sweep.model.position", "unknown position scheme 'alibbi'", "did you mean 'alibi'"]),
    "swept parameter of a variant the model does not use": (
        lambda t: t + "sweep: {model.attention.window: [4, 8]}\n", 11,
        ["sweep.model.attention.window", "model.attention is 'full' (the default)", "no parameter 'window'",
         "{name: sliding_window}"]),
    "learned table shorter than the training sequences": (
        lambda t: t.replace("position: rope", "position: {name: learned, max_len: 8}"), 8,
        ["model.position", "learned covers 8 positions", "raise max_len to at least"]),
    "two budgets": (lambda t: t.replace("steps: 20", "steps: 20, tokens: 100"), 9, ["train.steps", "exactly one"]),
    "a NUL byte": (lambda t: t.replace("d_model: 32", "d_model: 32\x00"), 5,
                   ["malformed YAML: it holds the character #x0000", "without control characters"]),
    "a name of 5,000 characters": (lambda t: t.replace("name: t", "name: " + "t" * 5000), 1,
                                   ["name: String should have at most 100 characters", "(5002 characters))"]),
}


@pytest.mark.parametrize("case", BAD)
def test_bad_input_names_file_field_line_and_choices(tmp_path, case):
    edit, line, fragments = BAD[case]
    path = write(tmp_path, edit(BASE))
    result = validate(path)
    assert result.exit_code == 2, result.output
    message = result.stderr.strip()
    assert len(message.splitlines()) == 1, message
    assert message.startswith(f"error: {path}:{line}: "), message
    for fragment in fragments:
        assert fragment in message, (fragment, message)
    assert "Traceback" not in result.output


def test_unknown_profile_lists_the_profiles(tmp_path):
    path = write(tmp_path, BASE + "profiles: {gpu: {train.precision: bf16-mixed}}\n")
    result = CliRunner().invoke(main, ["validate", str(path), "--profile", "gpx"])
    assert result.exit_code == 2
    assert "unknown profile 'gpx'; did you mean 'gpu'?" in result.stderr and "(valid: gpu)" in result.stderr


def test_missing_file_is_one_line(tmp_path):
    result = validate(tmp_path / "nope.yaml")
    assert result.exit_code == 2 and "study file not found" in result.stderr


def test_real_process_prints_no_traceback(tmp_path):
    """The installed command, not the test runner: exit 2, one line on stderr."""
    path = write(tmp_path, BASE.replace("n_layers: 1", "n_layers: [1"))
    proc = run_within_cpu([sys.executable, "-m", "workbench.cli", "validate", str(path)], 120, text=True)
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr and proc.stderr.count("\n") == 1
    assert f"{path}:7: malformed YAML" in proc.stderr


# ---- JSON Schema ----------------------------------------------------------------------------


def test_schema_is_json_schema_that_accepts_shipped_studies_and_rejects_typos():
    result = CliRunner().invoke(main, ["schema"])
    assert result.exit_code == 0
    schema = json.loads(result.output)
    jsonschema.Draft202012Validator.check_schema(schema)
    shipped = sorted(STUDIES.glob("*.yaml"))
    assert shipped, "no study ships in studies/"
    for path in shipped:
        jsonschema.validate(yaml.safe_load(path.read_text()), schema)
    tiny = yaml.safe_load((STUDIES / "tiny.yaml").read_text())
    for edit in (lambda s: s["model"].update(position="rop"), lambda s: s["train"].update(stpes=3),
                 lambda s: s.update(sweep={"model.position": []})):
        bad = json.loads(json.dumps(tiny))
        edit(bad)
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(bad, schema)


def test_schema_matches_what_the_loader_accepts():
    """Every shipped study also passes the loader and expands (a tuned study: its tuning runs,
    whose final runs wait for the choice)."""
    for path in sorted(STUDIES.glob("*.yaml")):
        study = load_study(path)
        if study.study.kind == "train":
            assert tuning_runs(study) if study.study.tune is not None else expand(study)


def test_a_long_enough_learned_table_and_eval_lengths_past_it_validate(tmp_path):
    """Past the training length a short table is recorded as not applicable, by design (E6)."""
    text = BASE.replace("position: rope", "position: {name: learned, max_len: 20}").replace(
        "alphabet_size: 8}", "alphabet_size: 8, eval_lengths: [8, 32]}")
    assert validate(write(tmp_path, text)).exit_code == 0


def test_expect_names_a_parameterised_variant_by_its_name_when_one_is_swept(tmp_path):
    swept = "sweep:\n  model.residual: [plain, {name: layerscale, init_scale: 0.1}]\n"
    expect = "expect: [{metric: accuracy@8, better: layerscale, than: plain}]\n"
    study = load_study(write(tmp_path, BASE + swept + expect)).study
    assert study.expect[0].better == {"model.residual": {"name": "layerscale", "init_scale": 0.1}}
    before = [r.run_id for r in expand(load_study(write(tmp_path, BASE + swept, "plain.yaml")))]
    assert [r.run_id for r in expand(load_study(write(tmp_path, BASE + swept + expect)))] == before


def test_expect_naming_two_swept_points_of_one_variant_lists_both(tmp_path):
    swept = ("sweep:\n  model.residual: [plain, {name: layerscale, init_scale: 0.1}, "
             "{name: layerscale, init_scale: 0.01}]\n")
    expect = "expect: [{metric: accuracy@8, better: layerscale, than: plain}]\n"
    with pytest.raises(Exception) as err:
        load_study(write(tmp_path, BASE + swept + expect))
    message = str(err.value)
    assert "expect.0.better" in message and "'layerscale' names 2 swept values of model.residual" in message
    assert "layerscale(init_scale=0.01)" in message and "layerscale(init_scale=0.1)" in message
