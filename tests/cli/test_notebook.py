"""The Python API for notebooks (workbench.notebook) and the example notebook that shows it,
executed cell by cell here as a kernel would (one namespace, in order)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from workbench.errors import WorkbenchError
from workbench.model.weights import make_task
from workbench.notebook import Tokenizer

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
    with pytest.raises(WorkbenchError, match="run_folder: no run of variant 'position=alibi'"):
        done.run_folder(variant="position=alibi")


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
