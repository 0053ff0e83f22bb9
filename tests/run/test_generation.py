"""`workbench generate` and exports that generate on their own: a small text_lm study trained
for a few steps (bytes and a BPE), and a reversal decoder (a symbol task, as the README's
quickstart trains), exported and continued by a new Python process that imports only
transformers; its tokens and text equal `workbench generate` on the run and on the export.
Then the refusals: a folder that holds no model, an empty prompt, a word the vocabulary lacks, a
model that is not a decoder, an export without its tokenizer, a sampling option with greedy
decoding; and a study's folder given for one of its runs."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

transformers = pytest.importorskip("transformers")

from workbench.cli import main  # noqa: E402
from workbench.model.transformer import build_model  # noqa: E402
from workbench.model.weights import load_final_model, save_final_weights  # noqa: E402

PROMPT = "def parse_args(self, "
N_NEW = 20
STUDY = """\
name: tiny-lm
task: {name: text_lm, path: corpus.txt, train_length: 32, n_eval: 4, decode_samples: 0, vocab_size: 300}
model: {family: decoder, d_model: 32, n_layers: 2, n_heads: 4}
train: {steps: 20, batch_size: 8, lr: 3.0e-3, log_every: 10, eval_every: 20}
sweep: {task.tokenizer: [bytes, bpe]}
"""

# Run by a fresh interpreter: only transformers (and what it imports) is loaded; the workbench's
# packages are made unimportable, so nothing of ours can take part.
ALONE = """\
import json, sys
sys.modules["workbench"] = sys.modules["workbench_plugins"] = None
import torch, transformers
folder, prompt, n_new = sys.argv[1], sys.argv[2], int(sys.argv[3])
tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
model = transformers.AutoModelForCausalLM.from_pretrained(folder).eval()
ids = tokenizer(prompt, return_tensors="pt").input_ids
out = model.generate(ids, max_new_tokens=n_new, do_sample=False)
piped = transformers.pipeline("text-generation", model=folder)(prompt, max_new_tokens=n_new, do_sample=False)
with torch.no_grad():
    logits = model(ids).logits[0]
print(json.dumps({"prompt_ids": ids[0].tolist(), "new_ids": out[0, ids.shape[1]:].tolist(),
                  "text": tokenizer.decode(out[0], skip_special_tokens=True), "pipeline": piped[0]["generated_text"],
                  "logits": logits.tolist(), "class": type(model).__name__}))
"""


def cli(*args: str):
    return CliRunner().invoke(main, list(args))


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    """tokenizer -> the folder of its trained run (a 40 KB slice of Python's argparse as corpus)."""
    import argparse

    root = tmp_path_factory.mktemp("tiny-lm")
    (root / "corpus.txt").write_bytes(Path(argparse.__file__).read_bytes()[:40_000])
    (root / "tiny.yaml").write_text(STUDY)
    result = cli("run", str(root / "tiny.yaml"), "--quiet", "--out", str(root / "runs"), "--reports",
                 str(root / "reports"))
    assert result.exit_code == 0, result.output
    folders = [p for p in (root / "runs" / "runs").iterdir() if p.is_dir()]
    return {load_final_model(p)[1]["task"].get("tokenizer", "bytes"): p for p in folders}


def generated(folder: Path, *options: str) -> dict:
    result = cli("generate", str(folder), PROMPT, "--max-new-tokens", str(N_NEW), "--json", *options)
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


@pytest.mark.parametrize("tokenizer", ["bytes", "bpe"])
def test_an_export_generates_alone_what_workbench_generate_writes(runs, tokenizer, tmp_path):
    run = runs[tokenizer]
    export = tmp_path / "export"
    result = cli("export", str(run), "--to", "hf", str(export))
    assert result.exit_code == 0, result.output
    assert "and its tokenizer" in result.stdout and "AutoTokenizer" in result.stdout
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"} <= \
        {p.name for p in export.iterdir()}

    ours = generated(run)
    assert len(ours["new_ids"]) == N_NEW  # the model never trained on <eos>: it does not stop early
    alone = subprocess.run([sys.executable, "-c", ALONE, str(export), PROMPT, str(N_NEW)], capture_output=True,
                           text=True)
    assert alone.returncode == 0, alone.stderr
    theirs = json.loads(alone.stdout.splitlines()[-1])
    assert theirs["class"] == "GPTNeoXForCausalLM"  # the default decoder: RoPE with LayerNorm
    assert theirs["prompt_ids"] == ours["prompt_ids"]
    assert theirs["new_ids"] == ours["new_ids"]
    assert theirs["text"] == theirs["pipeline"] == ours["text"]
    assert ours["text"].startswith(PROMPT)

    model, _ = load_final_model(run)  # the same numbers, not only the same argmax
    with torch.no_grad():
        mine = model(torch.tensor([ours["prompt_ids"]]))[0]
    assert (mine - torch.tensor(theirs["logits"])).abs().max() < 1e-4
    assert generated(export) == ours  # and `workbench generate` reads the export as it reads the run


REVERSAL = """\
name: tiny-reverse
task: {name: reverse, train_length: 6, min_length: 2, eval_lengths: [6], alphabet_size: 6, n_eval: 8}
model: {family: decoder, d_model: 32, n_layers: 2, n_heads: 4}
train: {steps: 40, batch_size: 16, lr: 3.0e-3, log_every: 20, eval_every: 40}
"""


def test_a_symbol_decoder_exports_its_words_and_generates_alone(tmp_path):
    """The README's quickstart trains decoders that reverse symbol strings: its export holds the
    task's words as a tokenizer, so transformers alone continues `<bos> a b c d <sep>` as the
    workbench does (the pipeline is left out: it prefixes the prompt as typed, specials and all)."""
    (tmp_path / "reverse.yaml").write_text(REVERSAL)
    trained = cli("run", str(tmp_path / "reverse.yaml"), "--quiet", "--out", str(tmp_path / "runs"), "--reports",
                  str(tmp_path / "reports"))
    assert trained.exit_code == 0, trained.output
    (run,) = [p for p in (tmp_path / "runs" / "runs").iterdir() if p.is_dir()]
    export = tmp_path / "export"
    assert cli("export", str(run), "--to", "hf", str(export)).exit_code == 0
    prompt = "<bos> a b c d <sep>"
    written = cli("generate", str(run), prompt, "--max-new-tokens", str(N_NEW), "--json")
    assert written.exit_code == 0, written.output
    ours = json.loads(written.stdout)
    assert ours["prompt_ids"] == [1, 4, 5, 6, 7, 3]  # <bos> a b c d <sep>: the ids the task trained on
    alone = subprocess.run([sys.executable, "-c", ALONE, str(export), prompt, str(N_NEW)], capture_output=True,
                           text=True)
    assert alone.returncode == 0, alone.stderr
    theirs = json.loads(alone.stdout.splitlines()[-1])
    assert theirs["class"] == "GPTNeoXForCausalLM"
    assert (theirs["prompt_ids"], theirs["new_ids"], theirs["text"]) == (ours["prompt_ids"], ours["new_ids"],
                                                                       ours["text"])
    assert ours["text"].startswith("a b c d")  # words apart by spaces, the specials left out
    exported = cli("generate", str(export), prompt, "--max-new-tokens", str(N_NEW), "--json")
    assert json.loads(exported.stdout) == ours


def test_sampling_is_seeded_and_top_k_1_is_greedy(runs):
    run = runs["bytes"]
    sampled = generated(run, "--strategy", "sample", "--temperature", "2.0", "--seed", "1")
    assert generated(run, "--strategy", "sample", "--temperature", "2.0", "--seed", "1") == sampled
    assert generated(run, "--strategy", "sample", "--temperature", "2.0", "--seed", "2") != sampled
    assert generated(run, "--strategy", "sample", "--top-k", "1")["new_ids"] == generated(run)["new_ids"]
    nucleus = generated(run, "--strategy", "sample", "--top-p", "0.9", "--seed", "1")
    assert len(nucleus["new_ids"]) == N_NEW


def refused(*args: str) -> str:
    result = cli("generate", *args)
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output and len(result.stderr.strip().splitlines()) == 1
    return result.stderr


def test_what_generate_refuses_is_one_line(runs, tmp_path):
    assert "no such folder" in refused(str(tmp_path / "nowhere"), "x")
    assert "neither a finished run folder" in refused(str(tmp_path), "x")
    assert "PROMPT: empty" in refused(str(runs["bytes"]), "")
    assert "--temperature: applies to --strategy sample" in refused(str(runs["bytes"]), "x", "--temperature", "0.5")

    symbols = tmp_path / "copy-run"  # a decoder of a symbol task: its prompt is words of its vocabulary
    symbols.mkdir()
    config = {"model": {"family": "decoder", "vocab_size": 8, "d_model": 16, "n_heads": 2, "n_layers": 1},
              "task": {"name": "copy", "train_length": 4, "alphabet_size": 4}, "seed": 0}
    save_final_weights(build_model(config["model"]), config, 0, symbols / "final.safetensors")
    assert "its vocabulary apart by whitespace: <pad> <bos> <eos> <sep> a b c d" in refused(str(symbols), "a z")
    encoder = tmp_path / "copy-encoder"
    encoder.mkdir()
    config = {**config, "model": {**config["model"], "family": "encoder"}, "task": {**config["task"], "name": "reverse"}}
    save_final_weights(build_model(config["model"]), config, 0, encoder / "final.safetensors")
    assert "its model.family is 'encoder' (trained on 'reverse'); generate continues a prompt with a decoder" in refused(str(encoder), "a b")

    export = tmp_path / "export"
    assert cli("export", str(runs["bytes"]), "--to", "hf", str(export)).exit_code == 0
    partial = tmp_path / "partial"
    shutil.copytree(export, partial)
    (partial / "tokenizer.json").unlink()
    assert "without tokenizer.json" in refused(str(partial), "x")
    (partial / "model.safetensors").unlink()
    (partial / "model.safetensors").symlink_to(export / "model.safetensors")  # a received folder: no links
    assert "link" in refused(str(partial), "x")


def test_a_study_folder_given_for_a_run_is_answered_with_its_runs(runs, tmp_path):
    study = runs["bytes"].parent.parent  # runs/<study>/, which holds results.db and runs/<run id>/
    first = min(runs.values())
    for folder in (study, study / "runs"):
        assert f"give one of them (e.g. {first}, one of 2 finished)" in refused(str(folder), "x")
    for command in (["export", str(study), "--to", "hf", str(tmp_path / "out")], ["eval", str(study), "--lengths", "16"]):
        result = cli(*command)
        assert result.exit_code == 2 and f"give one of them (e.g. {first}" in result.stderr, result.output
