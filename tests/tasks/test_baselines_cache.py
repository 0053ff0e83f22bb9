"""Baselines computed once per key and shared by every process through the data folder
(workbench.tasks.baselines.cached)."""

from __future__ import annotations

import math

import pytest

from workbench.tasks import baselines
from workbench.tasks.baselines import cached
from workbench.tasks.tokens import DATA_DIR_ENV


@pytest.fixture
def data_folder(tmp_path, monkeypatch):
    monkeypatch.setenv(DATA_DIR_ENV, str(tmp_path / "data"))
    monkeypatch.setattr(baselines, "KEPT_SCORES", {})
    return tmp_path / "data"


def counting(scores):
    calls = []

    def compute():
        calls.append(1)
        return scores
    return compute, calls


def test_a_key_is_computed_once_and_another_process_reads_it_from_the_data_folder(data_folder, monkeypatch):
    compute, calls = counting({"2-gram": {"bpc": 1.5, "loss": math.nan}})
    first = cached(("corpus", 64), compute)
    assert cached(("corpus", 64), compute) == first and len(calls) == 1  # this process
    monkeypatch.setattr(baselines, "KEPT_SCORES", {})  # a new process: only the file is left
    again = cached(("corpus", 64), compute)
    assert len(calls) == 1 and again["2-gram"]["bpc"] == 1.5 and math.isnan(again["2-gram"]["loss"])
    assert len(list((data_folder / "baselines").glob("*.json"))) == 1
    cached(("corpus", 128), compute)  # another key: computed
    assert len(calls) == 2 and len(list((data_folder / "baselines").iterdir())) == 2


def test_a_damaged_file_is_computed_again_and_replaced(data_folder, monkeypatch):
    compute, calls = counting({"2-gram": {"bpc": 1.5}})
    cached(("corpus", 64), compute)
    (stored,) = (data_folder / "baselines").glob("*.json")
    for damage in (b'{"2-gram": {"bpc": 1.', b'{"2-gram": {"bpc": "many"}}', b"[1, 2]"):
        stored.write_bytes(damage)
        monkeypatch.setattr(baselines, "KEPT_SCORES", {})
        assert cached(("corpus", 64), compute) == {"2-gram": {"bpc": 1.5}}
        assert baselines.SCORES.validate_json(stored.read_bytes()) == {"2-gram": {"bpc": 1.5}}
    assert len(calls) == 4


def test_a_data_folder_that_cannot_be_written_costs_only_the_reuse(tmp_path, monkeypatch):
    blocked = tmp_path / "a-file"
    blocked.write_text("not a folder")
    monkeypatch.setenv(DATA_DIR_ENV, str(blocked / "data"))
    monkeypatch.setattr(baselines, "KEPT_SCORES", {})
    compute, calls = counting({"2-gram": {"bpc": 1.5}})
    assert cached(("corpus", 64), compute) == {"2-gram": {"bpc": 1.5}} and len(calls) == 1
    assert blocked.read_text() == "not a folder"
