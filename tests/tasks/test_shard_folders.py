"""Token shard folders under $WORKBENCH_DATA_DIR are data the workbench checks before use
(issue 47): a tampered meta.json, a missing or short shard, a progress record out of shape, a
link in place of a folder or file, and a data folder that cannot be written are each one line
(or, for a progress record, a warning and a fresh start), never a traceback."""

from __future__ import annotations

import errno
import json
import os
import shutil

import numpy as np
import pytest
from click.testing import CliRunner

from workbench.cli import main
from workbench.errors import DiskError, WorkbenchError, WorkbenchWarning
from workbench.tasks import tokens as tokens_module
from workbench.tasks.corpus import Source

STUDY = """\
name: shards
task: {name: text_lm, path: corpus, train_length: 16, n_eval: 4, decode_samples: 0, tokenizer: bpe, vocab_size: 300}
model: {family: decoder, d_model: 16, n_layers: 1, n_heads: 2, position: rope}
train: {steps: 2, batch_size: 2}
"""


def corpus(tmp_path):
    rng = np.random.default_rng(0)
    words = "the cat sat on a mat while one dog ran far away".split()
    (tmp_path / "corpus").mkdir()
    for i in range(6):
        (tmp_path / "corpus" / f"d{i}.txt").write_text(" ".join(rng.choice(words, 600)) + "\n")
    (tmp_path / "study.yaml").write_text(STUDY)
    return tmp_path / "study.yaml"


@pytest.fixture
def data(tmp_path, monkeypatch):
    monkeypatch.setenv(tokens_module.DATA_DIR_ENV, str(tmp_path / "data"))
    return tmp_path / "data"


def prepare(study):
    return CliRunner().invoke(main, ["prepare", str(study)])


def one_line(result, text: str) -> None:
    assert result.exit_code == 2, result.output
    assert len(result.output.splitlines()) == 1 and result.output.startswith("error: "), result.output
    assert text in result.output, result.output


@pytest.fixture
def prepared(tmp_path, data):
    study = corpus(tmp_path)
    assert prepare(study).exit_code == 0
    [folder] = [p for p in data.iterdir() if p.is_dir()]
    return study, folder


def test_a_prepared_folder_holds_only_what_it_names_and_is_reused(prepared, data):
    study, folder = prepared
    assert sorted(p.name for p in folder.iterdir()) == ["meta.json", "tokenizer.json", "train.bin", "val.bin"]
    assert sorted(p.name for p in data.iterdir() if p.name.startswith(".")) == [f".{folder.name}.lock"]
    before = (folder / "train.bin").stat().st_mtime_ns
    assert prepare(study).exit_code == 0 and (folder / "train.bin").stat().st_mtime_ns == before


@pytest.mark.parametrize("edit, problem", [
    (lambda meta: {k: v for k, v in meta.items() if k != "dtype"}, "meta.json: dtype: Field required"),
    (lambda meta: [1, 2], "meta.json: Input should be a valid dictionary"),
    (lambda meta: {**meta, "dtype": "../../etc"}, "meta.json: dtype: Input should be 'uint8', 'uint16' or 'uint32'"),
    (lambda meta: {**meta, "dtype": "O"}, "dtype: Input should be 'uint8', 'uint16' or 'uint32'"),
    (lambda meta: {**meta, "dtype": "float64"}, "dtype: Input should be 'uint8', 'uint16' or 'uint32'"),
    (lambda meta: {**meta, "vocab_size": 10**12}, "vocab_size: Input should be less than or equal to"),
    (lambda meta: {**meta, "dtype": "uint8"}, "dtype: uint8 cannot hold the ids of a vocabulary of"),
    (lambda meta: {**meta, "splits": {**meta["splits"], "train": {"tokens": 10**15, "bytes": 1}}},
     "train.bin holds"),
    (lambda meta: "not json", "not valid JSON"),
])
def test_a_tampered_meta_json_is_one_line_naming_the_field(prepared, edit, problem):
    study, folder = prepared
    meta = json.loads((folder / "meta.json").read_text())
    edited = edit(meta)
    (folder / "meta.json").write_text(edited if isinstance(edited, str) else json.dumps(edited))
    result = prepare(study)
    one_line(result, f"{folder}: not a shard folder the workbench wrote (")
    assert problem in result.output


@pytest.mark.parametrize("damage, problem", [
    (lambda folder: (folder / "val.bin").unlink(), "val.bin is missing"),
    (lambda folder: (folder / "train.bin").write_bytes(b"\0\0\0"), "train.bin holds 3 bytes"),
    (lambda folder: (folder / "tokenizer.json").write_text('{"version": "1.0"}'), "tokenizer.json"),
])
def test_a_missing_or_short_shard_is_one_line(prepared, damage, problem):
    study, folder = prepared
    damage(folder)
    one_line(prepare(study), problem)


def test_a_folder_without_meta_json_is_an_unfinished_preparation_that_goes_on(prepared):
    """An earlier workbench prepared in place: its folder without meta.json is taken up and finished."""
    study, folder = prepared
    meta = (folder / "meta.json").read_text()
    (folder / "meta.json").unlink()
    assert prepare(study).exit_code == 0
    assert (folder / "meta.json").read_text() == meta and not list(folder.parent.glob("*.building"))


def test_a_shard_folder_or_file_that_is_a_link_is_refused(prepared, tmp_path):
    study, folder = prepared
    elsewhere = tmp_path / "elsewhere"
    shutil.move(folder, elsewhere)
    folder.symlink_to(elsewhere)
    one_line(prepare(study), "not a folder, or a symbolic link")
    folder.unlink()
    shutil.move(elsewhere, folder)
    (folder / "val.bin").rename(tmp_path / "val.bin")
    (folder / "val.bin").symlink_to(tmp_path / "val.bin")
    one_line(prepare(study), "val.bin is a symbolic link")


def interrupted_build(tmp_path, monkeypatch) -> tuple[tokens_module.Texts, object]:
    """A preparation stopped after its first batch of training text: its .building folder."""
    from workbench_plugins.task_text_lm import source_texts

    corpus(tmp_path)
    monkeypatch.setattr(tokens_module, "BATCH_BYTES", 1024)
    texts = source_texts(Source(str(tmp_path / "corpus")), 0.2)
    pieces = list(texts.train())

    def stopping():
        yield from pieces[:2]
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        tokens_module.prepare(tokens_module.Texts(texts.fingerprint, stopping, texts.valid), "bytes", 0)
    return texts


@pytest.mark.parametrize("counts", [{"pieces": -1, "tokens": 5, "bytes": 5, "complete": False},
                                    {"pieces": 1, "tokens": 10**15, "bytes": 1, "complete": False},
                                    "garbage"])
def test_a_progress_record_out_of_shape_starts_the_split_over_with_a_warning(tmp_path, data, monkeypatch, counts):
    texts = interrupted_build(tmp_path, monkeypatch)
    [building] = data.glob(".*.building")
    record = json.loads((building / "progress.json").read_text())
    (building / "progress.json").write_text(json.dumps({**record, "train": counts}))
    with pytest.warns(WorkbenchWarning, match="progress.json: not a progress record the workbench wrote"):
        resumed = tokens_module.prepare(texts, "bytes", 0)
    monkeypatch.setenv(tokens_module.DATA_DIR_ENV, str(tmp_path / "whole"))
    whole = tokens_module.prepare(texts, "bytes", 0)
    assert np.array_equal(resumed.tokens("train"), whole.tokens("train")) and resumed.meta == whole.meta


@pytest.mark.parametrize("code, kind, message", [
    (errno.ENOSPC, DiskError, "cannot write the token shards: the disk failed or is full (No space left on device)"),
    (errno.EROFS, WorkbenchError, "cannot write the token shards there (Read-only file system); set WORKBENCH_DATA_DIR"),
])
def test_a_data_folder_that_cannot_be_written_is_one_line_told_apart(tmp_path, data, monkeypatch, code, kind,
                                                                    message):
    study = corpus(tmp_path)

    def full(*args, **kwargs):
        raise OSError(code, os.strerror(code))

    monkeypatch.setattr(tokens_module, "write_split", full)
    result = prepare(study)
    one_line(result, message)
    with pytest.raises(kind):
        tokens_module.prepare(tokens_module.Texts("x", lambda: iter([b"a"]), lambda: iter([b"b"])), "bytes", 0)
