"""The Python API for notebooks (workbench.notebook) and the example notebook that shows it,
executed cell by cell here as a kernel would (one namespace, in order)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from workbench.errors import WorkbenchError
from workbench.model.weights import make_task
from workbench import notebook
from workbench.notebook import Tokenizer, pick_variant
from workbench.report.sweep_points import Variants

NOTEBOOK = Path(__file__).resolve().parents[2] / "examples" / "notebook.ipynb"


def run_notebook(path: Path) -> dict:
    """Execute every code cell of a notebook in one namespace, in order; the namespace."""
    notebook = json.loads(path.read_text(encoding="utf-8"))
    assert notebook["nbformat"] == 4
    namespace: dict = {"__name__": "__main__"}
    for index, cell in enumerate(c for c in notebook["cells"] if c["cell_type"] == "code"):
        exec(compile("".join(cell["source"]), f"{path.name}[code cell {index}]", "exec"), namespace)
    return namespace


def test_the_example_notebook_runs_a_study_and_uses_its_model(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("WORKBENCH_NOTEBOOK_OUT", str(tmp_path / "out"))
    ran = run_notebook(NOTEBOOK)
    done = ran["done"]
    results = ran["results"]
    assert len(results) == 2 and set(results["status"]) == {"finished"}
    assert sorted(results["model.position"]) == ["none", "rope"]
    [verdict] = done.verdicts
    assert verdict.statement == "position=rope is better than position=none on accuracy@8"
    assert verdict.outcome and verdict.groups and verdict.detail  # the report's own record
    assert done.report.is_file() and done.report.parent.parent == tmp_path / "out" / "reports"
    assert (tmp_path / "out" / "study.yaml").is_file()  # the mapping, written as the study file
    trained = ran["trained"]
    assert ran["ids"] == [trained.tokenizer.task.token_id[s] for s in "cadae"]
    assert trained.tokenizer.decode(ran["ids"]) == "c a d a e"
    answer = trained.generate("c a d a e", max_new_tokens=6)
    assert set(answer.split()) <= set("abcdefgh")  # the vocabulary's symbols, no special tokens
    with pytest.raises(WorkbenchError) as err:
        done.run_folder(variant="position=alibi")
    assert str(err.value) == "run_folder: no variant 'position=alibi'; the variants are:\n  position=none\n  position=rope"

    # load reads the finished folder as it stands: no second report, verdicts decided from the store
    def written():  # every file and when it was written (the store's SQLite files move on a read)
        return sorted((p, 0 if p.name.startswith("results.db") else p.stat().st_mtime_ns)
                      for p in (tmp_path / "out").rglob("*"))

    before = written()
    loaded = notebook.load(tmp_path / "out")
    assert written() == before
    assert loaded.report == done.report  # the report `run` wrote, found where it put it
    assert [(v.statement, v.outcome, v.label, v.detail, v.difference_text, v.seeds_text) for v in loaded.verdicts] == \
        [(v.statement, v.outcome, v.label, v.detail, v.difference_text, v.seeds_text) for v in done.verdicts]
    rope = done.run_folder(variant="position=rope")
    assert rope.name == results.loc[results["model.position"] == "rope", "run_id"].iloc[0]
    assert [loaded.run_folder(variant=name) for name in ("position=rope", "model.position=rope", "rope")] == [rope] * 3
    # the learning curves with the swept keys, to select and plot by; the gates' qualifier on each verdict
    curves = loaded.curves
    assert {"run_id", "step", "split", "metric", "value", "variant", "seed", "model.position"} <= set(curves.columns)
    assert set(curves["model.position"]) == {"none", "rope"} and set(curves["variant"]) == {"position=none",
                                                                                             "position=rope"}
    assert [v.qualifier for v in loaded.verdicts] == [v.qualifier for v in done.verdicts]
    assert all(v.qualifier in v.label for v in loaded.verdicts)
    assert written() == before


def test_a_byte_model_tokenizer_round_trips_text_without_offsets():
    task = make_task({"task": {"name": "text_lm", "train_length": 16}, "seed": 0})
    tokenizer = Tokenizer(task)
    ids = tokenizer.encode("héllo\n")
    assert ids == [b + task.first_token for b in "héllo\n".encode()]  # the offset is the tokenizer's business
    assert tokenizer.decode([task.bos_id, *ids, task.eos_id]) == "héllo\n"
    assert task.decoder_prompt(ids) == ids  # a text is continued as it stands


def test_a_symbol_outside_the_vocabulary_is_one_line():
    tokenizer = Tokenizer(make_task({"task": {"name": "copy", "train_length": 8, "alphabet_size": 4}, "seed": 0}))
    with pytest.raises(WorkbenchError, match="'z' is not in the copy vocabulary"):
        tokenizer.encode("a z")


TWO_KEYS = Variants(("model.position", "model.norm"),
                    (("rope", "pre(type=rmsnorm)"), ("alibi", "pre(type=rmsnorm)"), ("rope", "post")))


@pytest.mark.parametrize("name, label", [
    ("position=rope, norm=post", "position=rope, norm=post"),  # the label the report prints
    ("norm=post", "position=rope, norm=post"),  # enough of it to name one variant
    ("alibi", "position=alibi, norm=pre(type=rmsnorm)"),  # a bare value
    ("model.position=rope, norm=pre", "position=rope, norm=pre(type=rmsnorm)"),  # dotted key; a variant by its name
    ("rope, pre(type=rmsnorm)", "position=rope, norm=pre(type=rmsnorm)"),  # bare values, parameters kept whole
])
def test_run_folder_names_a_variant_by_its_label_or_enough_of_it(name, label):
    assert pick_variant(name, TWO_KEYS) == label


def test_a_variant_name_that_fits_several_lists_them_one_per_line():
    with pytest.raises(WorkbenchError) as err:
        pick_variant("position=rope", TWO_KEYS)
    assert str(err.value).splitlines() == ["run_folder: 'position=rope' names 2 variants; name one of them:",
                                           "  position=rope, norm=pre(type=rmsnorm)", "  position=rope, norm=post"]
    with pytest.raises(WorkbenchError) as err:
        pick_variant("norm=layernorm", TWO_KEYS)
    assert str(err.value).splitlines()[1:] == [f"  {label}" for label in TWO_KEYS.labels]


def test_load_says_there_is_no_report_and_builds_none(tmp_path):
    from workbench.run.store import Store

    Store(tmp_path / "out").save_study({"study": json.dumps({"name": "s", "kind": "train"})})
    loaded = notebook.load(tmp_path / "out")
    with pytest.raises(WorkbenchError, match="no report of this study found beside it; `.write_report\\(\\)` builds"):
        loaded.report
    assert not (tmp_path / "out" / "reports").exists()


def test_a_kind_without_its_own_verdicts_builds_its_report_in_scratch_and_says_so(tmp_path, capsys):
    from types import SimpleNamespace

    from workbench.kinds import StudyKind

    class Minimal(StudyKind):
        name = "minimal"
        describe = dry_run = run = lambda self, *a: None

        def report(self, out_dir, info, study, dest, pictures):
            assert not pictures and dest.is_dir() and dest != tmp_path
            return SimpleNamespace(verdicts=["a verdict"]), None

    assert Minimal().verdicts(tmp_path, {}, SimpleNamespace(name="m")) == ["a verdict"]
    assert "m: building the report (no attention pictures) in a scratch folder" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []
