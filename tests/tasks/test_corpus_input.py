"""A corpus is input the user names: each way it can be wrong is one line naming the file, the
line or the cause and what is valid, exit 2 (issue 47), never a traceback, a hang on a FIFO or
an endless read of a device."""

from __future__ import annotations

import os
import pathlib

import pytest
from click.testing import CliRunner

from workbench.cli import main
from workbench.tasks import tokens as tokens_module

STUDY = """\
name: corpus-input
task: {{name: text_lm, path: "{path}", train_length: 8, n_eval: 2, decode_samples: 0}}
model: {{family: decoder, d_model: 16, n_layers: 1, n_heads: 2, position: rope}}
train: {{steps: 2, batch_size: 2}}
"""
GOOD = b'{"text": "the first document, long enough for a window"}\n{"text": "and a second one, also long enough"}\n'


@pytest.fixture(autouse=True)
def shards(tmp_path, monkeypatch):
    monkeypatch.setenv(tokens_module.DATA_DIR_ENV, str(tmp_path / "data"))


def prepare(tmp_path, path: str | os.PathLike):
    (tmp_path / "study.yaml").write_text(STUDY.format(path=path))
    return CliRunner().invoke(main, ["prepare", str(tmp_path / "study.yaml")])


def one_line(result, *texts: str) -> None:
    assert result.exit_code == 2, result.output
    assert len(result.output.splitlines()) == 1 and result.output.startswith("error: task."), result.output
    for text in texts:
        assert text in result.output, result.output


def test_a_good_jsonl_corpus_prepares(tmp_path):
    (tmp_path / "docs.jsonl").write_bytes(GOOD * 3)
    result = prepare(tmp_path, "docs.jsonl")
    assert result.exit_code == 0 and "training and" in result.output, result.output


@pytest.mark.parametrize("bad, problem", [
    (b"not json\n", "line 8: not valid JSON (Expecting value at line 1 column 1)"),
    (b'{"text": ' + b"[" * 50_000 + b"]" * 50_000 + b"}\n", "line 8: nested over 32 levels deep"),
    ('{"text": "café"}\n'.encode("latin-1"), "line 8: not UTF-8 text"),
])
def test_a_bad_jsonl_line_is_one_line_naming_it(tmp_path, bad, problem):
    (tmp_path / "docs.jsonl").write_bytes(GOOD * 3 + b"\n" + bad)  # line 8, after a blank line
    one_line(prepare(tmp_path, "docs.jsonl"), f"docs.jsonl: {problem}", "each line of a JSON Lines file is one "
             "JSON object (UTF-8) with the field 'text'")


def test_a_garbage_parquet_file_is_one_line(tmp_path):
    (tmp_path / "docs.parquet").write_bytes(os.urandom(2000))
    one_line(prepare(tmp_path, "docs.parquet"), "docs.parquet is not a readable Parquet file")


@pytest.mark.parametrize("make, kind", [
    (lambda path: os.mkfifo(path), "a FIFO"),
    (lambda path: path.symlink_to("/dev/zero"), "a character device"),
])
def test_a_path_that_is_no_file_of_text_is_named_as_what_it_is(tmp_path, make, kind):
    """A FIFO (opening it blocks) and a link to /dev/zero (it never ends) read 'no such file'."""
    make(tmp_path / "corpus.txt")
    one_line(prepare(tmp_path, "corpus.txt"), f"corpus.txt is {kind}, not a file or folder of text")


def test_a_folder_that_cannot_be_read_is_one_line(tmp_path, monkeypatch):
    """As `path: /` meets /proc (a PermissionError); mocked: the tests may run as root."""
    (tmp_path / "corpus").mkdir()

    def denied(self, pattern):
        raise PermissionError(13, "Permission denied", str(self / "locked"))
        yield  # a generator, as Path.rglob is

    monkeypatch.setattr(pathlib.Path, "rglob", denied)
    one_line(prepare(tmp_path, "corpus"), "task.path: cannot read", "corpus/locked (Permission denied)")
