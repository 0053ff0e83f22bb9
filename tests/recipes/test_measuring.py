"""Scaling studies: YAML schema, expansion, and rows in the same store as training runs."""

import textwrap

import pytest

from workbench.errors import WorkbenchError
from workbench.cost.fit import fit_exponents
from workbench.api import run_study
from workbench.recipes.scaling.study import ScalingStudy
from workbench.recipes.scaling.measuring import measurements, run_scaling
from workbench.results import git_commit
from workbench.run.store import Store, load_results
from workbench.study import load_study

STUDY = """\
name: tiny-scaling
kind: scaling
model: {vocab_size: 32, d_model: 16, n_heads: 4, n_layers: 1, position: none}
sweep: {model.attention: [full, {name: sliding_window, window: 8}]}
scaling:
  lengths: [16, 32, 64]
  modes: [train_step, decode]
  decode_lengths: [16, 32]
  scope: layer
  repeats: 2
  warmup: 0
  threads: 1
  isolate: false
"""


def write(tmp_path, text, name="study.yaml"):
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path




def test_scaling_study_expands(tmp_path):
    study = load_study(write(tmp_path, STUDY)).study
    assert isinstance(study, ScalingStudy)
    todo = measurements(study)
    # 2 variants x (3 train_step lengths + 2 decode lengths x cache on/off)
    assert len(todo) == 2 * (3 + 2 * 2)
    decode = [p for _, p in todo if p.mode == "decode"]
    assert {p.scope for p in decode} == {"model"} and {p.kv_cache for p in decode} == {True, False}


@pytest.mark.parametrize(("change", "message"), [
    ("sweep: {train.lr: [1, 2]}", "sweeps model keys only"),
    ("sweep: {model.atention: [full]}", "model.attention"),
    ("sweep: {model.family: [encoder]}", "decode needs a decoder"),
])
def test_mistakes_name_the_field(tmp_path, change, message):
    text = STUDY.replace("sweep: {model.attention: [full, {name: sliding_window, window: 8}]}", change)
    with pytest.raises(WorkbenchError, match=message):
        load_study(write(tmp_path, text))


def test_run_scaling_without_a_store_gives_flat_rows():
    text = STUDY.replace("lengths: [16, 32, 64]", "lengths: [16]").replace("modes: [train_step, decode]", "modes: [forward]")
    study = ScalingStudy.model_validate(__import__("yaml").safe_load(text))
    rows = run_scaling(study)
    assert [(r["model.attention"], r["status"], r["mode"], r["length"]) for r in rows] == [
        ("full", "finished", "forward", 16), ("sliding_window(window=8)", "finished", "forward", 16)]
    assert rows[0]["activation_bytes"] is None  # inference keeps no activations for backward


def test_unknown_scaling_key_is_reported(tmp_path):
    with pytest.raises(WorkbenchError, match="scaling.repeat"):
        load_study(write(tmp_path, STUDY.replace("  repeats: 2", "  repeat: 2")))


def test_results_go_to_the_store_and_a_rerun_keeps_them(tmp_path):
    path = write(tmp_path, STUDY.replace("modes: [train_step, decode]", "modes: [train_step]"))
    out = tmp_path / "out"
    summary = run_study(path, out, quiet=True)
    assert summary.total == 6 and summary.statuses["finished"] == 6
    frame = load_results(out)
    assert len(frame) == 6
    assert set(frame["length"]) == {16, 32, 64} and set(frame["mode"]) == {"train_step"}
    assert set(frame["flops_source"]) == {"allowed_pairs+flop_counter(rest)"}  # labels stay text
    assert set(frame["flops_executed_source"]) == {"flop_counter+cpu_flash_tiles"}
    assert (frame["flops_executed"] >= frame["flops"]).all()
    assert (frame["activation_bytes"] > 0).all() and (frame["time_median_s"] > 0).all()
    assert set(frame["peak_memory_instrument"]) == {"torch_dispatch_live_tensor_bytes"}
    assert (frame["peak_memory_bytes"] > 0).all() and "process_peak_rss_delta_bytes" in frame
    assert set(frame["model.attention"]) == {"full", "sliding_window(window=8)"}
    # every measurement records the source commit that took it, as a training run does
    assert {r["environment"]["git_commit"] for r in Store(out, create=False).runs()} == {git_commit()}
    fits = fit_exponents(frame, by=("model.attention",), metrics=("flops",), top=3)
    by_variant = fits.set_index("model.attention")["exponent"]
    # analytic attention FLOPs: n(n+1)/2 pairs for full; a window of 8 grows linearly
    assert by_variant["full"] > by_variant["sliding_window(window=8)"]
    again = run_study(path, out, quiet=True)
    assert again.skipped == 6 and not again.statuses
