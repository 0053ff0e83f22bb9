"""A report shipped with its data (`workbench report OUT --with-data`) rebuilds from that data
alone, as a fresh clone has it: the store and the weights its pictures load, nothing else."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from safetensors import safe_open

from workbench.cli import main
from workbench.api import run_study


def weights(data: Path) -> dict[str, bytes]:
    return {p.relative_to(data).as_posix(): p.read_bytes() for p in data.rglob("final.safetensors")}


def test_a_report_with_its_data_rebuilds_from_that_data_alone(tmp_path, monkeypatch):
    study = tmp_path / "tiny.yaml"
    study.write_text((Path(__file__).resolve().parents[2] / "studies" / "tiny.yaml").read_text())
    run_study(study, tmp_path / "out", quiet=True)
    result = CliRunner().invoke(main, ["report", str(tmp_path / "out"), "--out", str(tmp_path / "reports"), "--with-data"])
    assert result.exit_code == 0, result.output
    shipped = tmp_path / "reports" / "tiny"
    data = shipped / "data"
    kept = sorted(p.relative_to(data).as_posix() for p in data.rglob("*") if p.is_file())
    assert kept[0] == "results.db" and len([k for k in kept if k.endswith("final.safetensors")]) == 2  # one per variant
    before = json.loads((shipped / "summary.json").read_text())
    with safe_open(str(next(data.rglob("final.safetensors"))), framework="pt") as f:  # half the bytes of float32
        assert {f.get_tensor(name).dtype for name in f.keys()} == {torch.float16} and "config" in f.metadata()
    pictures = {p.name: p.read_bytes() for p in (shipped / "figures").glob("attention_*")}

    # a fresh clone: the reports folder alone, somewhere else, the study's run folder gone
    clone = tmp_path / "clone"
    shutil.copytree(tmp_path / "reports", clone / "reports")
    shutil.rmtree(tmp_path / "out")
    monkeypatch.chdir(clone)
    shipped_store = (clone / "reports" / "tiny" / "data" / "results.db").read_bytes()
    shipped_weights = weights(clone / "reports" / "tiny" / "data")
    result = CliRunner().invoke(main, ["report", "reports/tiny/data"])
    assert result.exit_code == 0, result.output
    after = json.loads((clone / "reports" / "tiny" / "summary.json").read_text())
    assert after["verdicts"] == before["verdicts"] and after["first_result"] == before["first_result"]
    # rebuilt in place, its data kept byte for byte: a committed store does not change when no row did
    assert (clone / "reports" / "tiny" / "data" / "results.db").read_bytes() == shipped_store
    assert weights(clone / "reports" / "tiny" / "data") == shipped_weights
    # the pictures are drawn at the precision the weights ship in: the rebuild draws the same pixels
    assert pictures and {p.name: p.read_bytes() for p in (clone / "reports" / "tiny" / "figures").glob("attention_*")} \
        == pictures
    # training it again goes to runs/, never into the shipped store
    reproduce = (clone / "reports" / "tiny" / "report.md").read_text()
    assert "--out runs/tiny\nworkbench report runs/tiny\nworkbench report reports/tiny/data" in reproduce
    assert any(p.name.startswith("attention_") for p in (clone / "reports" / "tiny" / "figures").iterdir())
    # a link planted in the report folder is refused before anything is written: nothing outside is touched
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "keep.png").write_text("keep")
    shutil.rmtree(clone / "reports" / "tiny" / "figures")
    (clone / "reports" / "tiny" / "figures").symlink_to(victim)
    refused = CliRunner().invoke(main, ["report", "reports/tiny/data"])
    assert refused.exit_code == 2 and "figures is a symbolic link" in refused.output, refused.output
    assert len(refused.output.splitlines()) == 1 and (victim / "keep.png").read_text() == "keep"


def test_a_text_report_rebuilds_without_its_corpus_leaving_out_only_the_pictures(tmp_path, monkeypatch):
    """A clone on a machine without the study's corpus: the attention pictures need the task's
    text and are left out with one line each; every verdict and table comes from the store."""
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for i in range(6):
        (corpus / f"doc{i}.txt").write_text(f"document {i}: " + "the cat sat on the mat and looked at it. " * 40)
    study = tmp_path / "lm.yaml"
    study.write_text(f"name: lm\ntask: {{name: text_lm, train_length: 16, n_eval: 4, path: {corpus}, decode_samples: 0}}\n"
                     "model: {d_model: 16, n_layers: 1, n_heads: 2}\ntrain: {steps: 2, batch_size: 2}\nseeds: [0]\n")
    run_study(study, tmp_path / "out", quiet=True)
    shipped = CliRunner().invoke(main, ["report", str(tmp_path / "out"), "--out", str(tmp_path / "reports"), "--with-data"])
    assert shipped.exit_code == 0, shipped.output
    before = json.loads((tmp_path / "reports" / "lm" / "summary.json").read_text())
    assert "attention_" in (tmp_path / "reports" / "lm" / "report.md").read_text()

    shutil.rmtree(corpus)
    monkeypatch.chdir(tmp_path)
    rebuilt = CliRunner().invoke(main, ["report", "reports/lm/data"])
    assert rebuilt.exit_code == 0, rebuilt.output
    md = (tmp_path / "reports" / "lm" / "report.md").read_text()
    assert "no attention pictures: its task cannot be made here (task.path: no such file" in md
    assert json.loads((tmp_path / "reports" / "lm" / "summary.json").read_text())["runs"] == before["runs"]


def test_shipped_data_keeps_no_weights_of_tuning_runs(tmp_path):
    """The pictures load each variant's final run with the lowest seed: a tuning run's weights
    (one per candidate value) would only make the committed data larger."""
    tiny = (Path(__file__).resolve().parents[2] / "studies" / "tiny.yaml").read_text()
    study = tmp_path / "tuned.yaml"
    study.write_text(tiny.replace("train: {steps: 30,", "tune: {train.lr: [1.0e-3, 3.0e-3], metric: loss@8, seeds: 1}\n"
                                  "train: {steps: 30,"))
    run_study(study, tmp_path / "out", quiet=True)
    result = CliRunner().invoke(main, ["report", str(tmp_path / "out"), "--out", str(tmp_path / "reports"), "--with-data"])
    assert result.exit_code == 0, result.output
    weights = list((tmp_path / "reports" / "tiny" / "data").rglob("final.safetensors"))
    assert len(weights) == 2  # one per variant: none, rope; not the 4 tuning runs
    configs = [json.loads((w.parent / "config.json").read_text()) for w in weights]
    assert all(c.get("split") != "validation" for c in configs)


def test_only_a_reports_own_data_folder_reproduces_into_runs():
    from workbench.report import reproduce_command

    info = {"name": "tiny", "source": "studies/tiny.yaml"}
    shipped = reproduce_command(info, Path("reports/tiny/data"))
    assert shipped.startswith("workbench run studies/tiny.yaml --out runs/tiny\nworkbench report runs/tiny\n")
    # a user's own run folder that happens to be called data is where the study trains again
    assert reproduce_command(info, Path("data")) == "workbench run studies/tiny.yaml --out data\nworkbench report data"


LADDER = """\
name: ladder
task: {name: copy, train_length: 6, n_eval: 16, alphabet_size: 6}
model: {family: decoder, d_model: 16, n_layers: 1, n_heads: 2}
train: {steps: 4, batch_size: 4, log_every: 2, eval_every: 4}
seeds: [0]
sweep: {model.position: [none, rope, alibi]}
scale: {model.d_model: [16, 32]}
expect:
  - {metric: accuracy@6, better: rope, than: none}
"""


@pytest.mark.parametrize("pictures, shipped", [(True, 2), (False, 6)])
def test_a_ladder_ships_the_weights_of_the_arms_it_pictures_at_its_first_rung(tmp_path, pictures, shipped):
    """Issue 65's budget for committed data: the pictures (and so the shipped weights) are of the
    variants the expect: entries compare, at the ladder's first rung; a report that draws no
    pictures ships each variant's weights as before, so a rebuild from its data may draw them."""
    study = tmp_path / "ladder.yaml"
    study.write_text(LADDER)
    run_study(study, tmp_path / "out", quiet=True)
    args = ["report", str(tmp_path / "out"), "--out", str(tmp_path / "reports"), "--with-data"]
    result = CliRunner().invoke(main, args + ([] if pictures else ["--no-pictures"]))
    assert result.exit_code == 0, result.output
    data = tmp_path / "reports" / "ladder" / "data"
    configs = [json.loads((w.parent / "config.json").read_text()) for w in data.rglob("final.safetensors")]
    assert len(configs) == shipped
    if pictures:
        assert {(c["model"]["position"]["name"], c["model"]["d_model"]) for c in configs} == {("rope", 16), ("none", 16)}
        md = (tmp_path / "reports" / "ladder" / "report.md").read_text()
        assert "Pictures for 2 of 6 variants (that the expect: entries compare, at the ladder's first rung, d\\_model=16" in md
        summary = json.loads((tmp_path / "reports" / "ladder" / "summary.json").read_text())
        assert len(summary["pictured_runs"]) == 2
