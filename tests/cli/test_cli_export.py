"""`workbench export` writes only the folder it is given (issue 47): OUT is built in a fresh
temporary sibling and renamed into place, so a link at OUT or inside it is never followed, an
OUT that holds anything is refused, and every bad argument or disk error is one line, exit 2."""

from __future__ import annotations

import errno
import math
import os
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

pytest.importorskip("transformers")

from workbench.cli import main  # noqa: E402
from workbench.model.transformer import build_model  # noqa: E402
from workbench.model.weights import save_final_weights  # noqa: E402
from workbench.results import FINAL_WEIGHTS, write_folder_atomically  # noqa: E402

SPEC = dict(family="decoder", vocab_size=16, d_model=16, n_layers=1, n_heads=4, n_kv_heads=2, position="rope",
            ffn="swiglu", norm={"name": "pre", "type": "rmsnorm"}, tie_embeddings=False)
TASK = {"name": "copy", "train_length": 4, "alphabet_size": 4, "n_eval": 8}
VICTIM_TEXT = "the user's own file\n"


def run_folder(path: Path, poison: bool = False) -> Path:
    """A run folder as a finished run leaves it (its final weights), without training one."""
    torch.manual_seed(0)
    model = build_model(SPEC)
    if poison:
        with torch.no_grad():
            next(model.parameters())[0, 0] = math.nan
    path.mkdir(parents=True)
    save_final_weights(model, {"model": SPEC, "task": TASK, "seed": 0}, 3, path / FINAL_WEIGHTS)
    return path


@pytest.fixture
def run(tmp_path) -> Path:
    return run_folder(tmp_path / "run")


@pytest.fixture
def victim(tmp_path) -> Path:
    folder = tmp_path / "victim"
    folder.mkdir()
    (folder / "config.json").write_text(VICTIM_TEXT)
    return folder


def export(run: Path, out: str | Path):
    result = CliRunner().invoke(main, ["export", str(run), str(out), "--to", "hf"])
    assert "Traceback" not in result.output and result.exception is None or isinstance(result.exception, SystemExit)
    return result


def refused(result, text: str) -> None:
    assert result.exit_code == 2, result.output
    assert result.stderr.startswith("error: ") and len(result.stderr.splitlines()) == 1, result.stderr
    assert text in result.stderr, result.stderr


def untouched(victim: Path) -> bool:
    return sorted(p.name for p in victim.iterdir()) == ["config.json"] and \
        (victim / "config.json").read_text() == VICTIM_TEXT


def test_an_export_writes_a_new_folder_that_transformers_loads(run, tmp_path):
    import transformers

    result = export(run, tmp_path / "deep" / "new")
    assert result.exit_code == 0, result.output
    assert "LlamaForCausalLM" in result.stdout and result.stderr == ""  # no progress bar around the line
    loaded = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "deep" / "new")
    assert type(loaded).__name__ == "LlamaForCausalLM"
    assert [p.name for p in (tmp_path / "deep").iterdir()] == ["new"]  # no temporary folder left beside it
    assert oct((tmp_path / "deep" / "new").stat().st_mode & 0o777) != oct(0o700)  # made as mkdir makes folders


def test_an_empty_folder_is_filled(run, tmp_path):
    (tmp_path / "empty").mkdir()
    assert export(run, tmp_path / "empty").exit_code == 0
    assert (tmp_path / "empty" / "config.json").is_file()


def test_out_as_a_link_to_another_folder_is_refused_and_that_folder_untouched(run, tmp_path, victim):
    (tmp_path / "out").symlink_to(victim)
    refused(export(run, tmp_path / "out"), f"out is a symbolic link (to {victim})")
    assert untouched(victim)


def test_a_link_inside_out_is_never_followed(run, tmp_path, victim):
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "config.json").symlink_to(victim / "config.json")
    refused(export(run, tmp_path / "out"), "already holds files; give a new folder (or an empty one)")
    assert untouched(victim)


def test_a_link_planted_at_out_while_it_is_written_is_never_followed(tmp_path, victim):
    """rename(2) never follows a link at its target: a folder cannot replace a link there."""
    from workbench.errors import WorkbenchError

    out = tmp_path / "out"

    def write(folder: Path) -> None:
        (folder / "config.json").write_text("exported")
        out.symlink_to(victim)  # planted after the checks, before the rename

    with pytest.raises(WorkbenchError, match="out: cannot write it there"):
        write_folder_atomically(out, write)
    assert untouched(victim) and sorted(p.name for p in tmp_path.iterdir()) == ["out", "victim"]


@pytest.mark.parametrize("make, message", [
    (lambda p: p.symlink_to(p.parent / "nowhere"), "is a symbolic link (to "),
    (lambda p: p.write_text("mine"), "exists and is not a folder"),
    (lambda p: None, None),  # a control: an absent OUT is written
])
def test_an_out_that_is_not_a_new_folder_is_one_line(run, tmp_path, make, message):
    out = tmp_path / "out"
    make(out)
    result = export(run, out)
    if message is None:
        assert result.exit_code == 0, result.output
        return
    refused(result, message)
    assert not (tmp_path / "nowhere").exists()
    assert out.is_symlink() or out.read_text() == "mine"


@pytest.mark.parametrize("out, message", [
    ("", "'' names no new folder"),
    ("/proc/self/x", "/proc/self/x: cannot create the folder there"),
])
def test_an_out_that_cannot_be_a_folder_is_one_line(run, out, message):
    refused(export(run, out), message)


def test_a_run_that_is_a_file_is_one_line(tmp_path):
    (tmp_path / "file").write_text("x")
    refused(export(tmp_path / "file", tmp_path / "out"), "no final weights")
    assert not (tmp_path / "out").exists()


def test_weights_holding_nan_are_refused_naming_the_tensor(tmp_path):
    poisoned = run_folder(tmp_path / "poisoned", poison=True)
    refused(export(poisoned, tmp_path / "out"), "holds NaN or infinite values")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("code, message", [
    (errno.ENOSPC, "the disk failed or is full (No space left on device); free some space"),
    (errno.EROFS, "cannot write it there (Read-only file system); choose a folder"),
])
def test_a_full_or_read_only_disk_is_one_line_told_apart_and_leaves_nothing(run, tmp_path, monkeypatch, code,
                                                                            message):
    import transformers

    def fail(self, folder, **kwargs):
        (Path(folder) / "model.safetensors").write_bytes(b"half")
        raise OSError(code, os.strerror(code))

    monkeypatch.setattr(transformers.PreTrainedModel, "save_pretrained", fail)
    refused(export(run, tmp_path / "out"), message)
    assert list(tmp_path.iterdir()) == [run]  # neither OUT nor a temporary folder


def test_an_os_error_worded_by_a_rust_library_is_a_disk_error(tmp_path):
    from safetensors import SafetensorError

    from workbench.errors import DiskError

    def fail(folder: Path) -> None:
        raise SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")

    with pytest.raises(DiskError, match="No space left on device"):
        write_folder_atomically(tmp_path / "out", fail)
    assert list(tmp_path.iterdir()) == []
