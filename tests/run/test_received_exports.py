"""A received export and its tokenizer are data (issue 64): `workbench generate` on a tampered
export folder (config.json, tokenizer.json, the weights) ends with one line, never a traceback,
a hang, or a continuation from random or NaN weights; its options have bounds."""

from __future__ import annotations

import json
import math
import shutil
import threading
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

pytest.importorskip("transformers")

from workbench.cli import main  # noqa: E402
from workbench.errors import SpecError, WorkbenchError  # noqa: E402
from workbench.model.transformer import build_model  # noqa: E402
from workbench.model.weights import save_final_weights  # noqa: E402
from workbench.results import FINAL_WEIGHTS  # noqa: E402
from workbench.run import generation, received_model  # noqa: E402

# The default decoder (GPT-NeoX when exported) of a copy task: 4 specials and 6 symbols.
CONFIG = {"model": {"family": "decoder", "vocab_size": 10, "d_model": 16, "n_layers": 2, "n_heads": 2},
          "task": {"name": "copy", "train_length": 4, "alphabet_size": 6, "n_eval": 8}, "seed": 0}
PROMPT = "<bos> a b c <sep>"


def cli(*args: str):
    return CliRunner().invoke(main, list(args))


def run_folder(path: Path, poison: bool = False, spec: dict | None = None) -> Path:
    """A finished run's folder (its final weights), without training one."""
    config = {**CONFIG, "model": spec or CONFIG["model"]}
    torch.manual_seed(0)
    model = build_model(config["model"])
    if poison:
        with torch.no_grad():
            model.decoder.blocks[0].attn.out.weight[0, 0] = math.nan
    path.mkdir(parents=True)
    save_final_weights(model, config, 3, path / FINAL_WEIGHTS)
    return path


@pytest.fixture(scope="module")
def exported(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("received-export")
    result = cli("export", str(run_folder(root / "run")), "--to", "hf", str(root / "export"))
    assert result.exit_code == 0, result.output
    return root / "export"


def tampered(exported: Path, tmp_path: Path, config=None, tokenizer=None, weights=None, config_text=None) -> Path:
    """A copy of the export with config.json, tokenizer.json or the weights edited."""
    folder = tmp_path / "received"
    shutil.copytree(exported, folder)
    if config is not None or config_text is not None:
        data = json.loads((folder / "config.json").read_text())
        if config is not None:
            config(data)
        (folder / "config.json").write_text(config_text(data) if config_text else json.dumps(data))
    if tokenizer is not None:
        data = json.loads((folder / "tokenizer.json").read_text())
        tokenizer(data)
        (folder / "tokenizer.json").write_text(json.dumps(data))
    if weights is not None:
        from safetensors.torch import load_file, save_file

        tensors = load_file(folder / "model.safetensors")
        weights(tensors)
        save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
    return folder


def refused(folder: Path, prompt: str = PROMPT, *options: str) -> str:
    result = cli("generate", str(folder), prompt, *options)
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output and len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert result.stderr.startswith("error: ") and result.stdout == ""
    return result.stderr


def test_the_export_generates(exported):
    result = cli("generate", str(exported), PROMPT, "--json", "--max-new-tokens", "3")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["prompt_ids"] == [1, 4, 5, 6, 3]


MOE = {"norm": {"name": "pre", "type": "rmsnorm"}, "position": "rope", "bias": False,
       "ffn": {"name": "moe", "n_experts": 4, "top_k": 2}}


@pytest.mark.parametrize("model_type, spec", [
    ("mixtral", {**CONFIG["model"], **MOE}),
    ("olmoe", {**CONFIG["model"], **MOE, "attention": {"name": "full", "qk_norm": "projection"}}),
])
def test_an_exported_mixture_of_experts_generates_what_its_run_does(model_type, spec, tmp_path):
    """transformers saves these experts one tensor per expert where its module fuses them: the
    check reads the names it saves, not the module's (it refused every MoE export before)."""
    run = run_folder(tmp_path / "run", spec=spec)
    assert cli("export", str(run), "--to", "hf", str(tmp_path / "export")).exit_code == 0
    assert json.loads((tmp_path / "export" / "config.json").read_text())["model_type"] == model_type
    continuations = []
    for folder in (run, tmp_path / "export"):
        result = cli("generate", str(folder), PROMPT, "--json", "--max-new-tokens", "6")
        assert result.exit_code == 0, result.output
        continuations.append(json.loads(result.stdout)["new_ids"])
    assert continuations[0] == continuations[1] and len(continuations[0]) == 6


def added_token(data):
    data["added_tokens"].append({"id": 40, "content": "<evil>", "single_word": False, "lstrip": False,
                                 "rstrip": False, "normalized": False, "special": False})


def set_(key, value):
    return lambda data: data.__setitem__(key, value)


def at_id(word, token_id):
    return lambda data: data["model"]["vocab"].__setitem__(word, token_id)


def nan_weight(tensors):
    tensors["gpt_neox.layers.1.mlp.dense_h_to_4h.weight"][3, 1] = math.nan


@pytest.mark.parametrize("edit, message", [
    # the config's architecture against the weights
    ({"config": set_("num_hidden_layers", 3000)},
     "config.json describes a GPTNeoXForCausalLM of 3000 layers; the weights hold 23 tensors in all"),
    ({"config": set_("num_hidden_layers", 1)},
     "(1 layer, vocabulary 10), and the weights hold gpt_neox.layers.1.attention.dense.weight, which it has no "
     "place for (and 9 more)"),
    ({"config": lambda c: c.update(model_type="gpt2", architectures=["GPT2LMHeadModel"], n_embd=16, n_head=2,
                                   n_layer=2)},
     "describes a GPT2LMHeadModel (2 layers, vocabulary 10) whose transformer.wte.weight the weights lack"),
    ({"config": set_("vocab_size", 10**9)},
     "whose gpt_neox.embed_in.weight is [1000000000, 16]; the weights hold F32 [10, 16]"),
    ({"config": set_("model_type", "qwen2")}, "model_type: "),
    ({"config": lambda c: c.update(model_type="bert")}, "an export of a BertModel (AutoModel); generate continues"),
    ({"config": set_("pad_token_id", 99)}, "pad_token_id: "),
    ({"config": set_("eos_token_id", 2**32 - 1)}, "eos_token_id: "),
    ({"config_text": lambda c: json.dumps(c)[:-1] + ', "x": ' + "[" * 5000 + "]" * 5000 + "}"},
     "config.json: nested over 32 levels deep"),
    ({"config_text": lambda c: json.dumps(c)[:-1] + ', "x": 1' + "0" * 400 + "}"},
     "config.json: an integer of 401 digits"),
    # the weights
    ({"weights": nan_weight}, "model.safetensors: gpt_neox.layers.1.mlp.dense_h_to_4h.weight holds NaN or infinite"),
    ({"weights": lambda t: t.__setitem__("gpt_neox.embed_in.weight", t["gpt_neox.embed_in.weight"].long())},
     "whose gpt_neox.embed_in.weight is [10, 16]; the weights hold I64 [10, 16]"),
    # ids the tokenizer can produce, past the model's vocabulary
    ({"tokenizer": at_id("zzz", 2**32 - 1)}, "its tokenizer writes 'zzz' as id 4294967295, past the model's "
                                             "vocabulary of 10"),
    ({"tokenizer": at_id("a", 10)}, "its tokenizer writes 'a' as id 10"),
    ({"tokenizer": added_token}, "its tokenizer writes '<evil>' as id 10"),
])
def test_a_tampered_export_is_one_line(exported, tmp_path, edit, message):
    assert message in refused(tampered(exported, tmp_path, **edit))


def test_a_tokenizer_regex_that_backtracks_is_one_line_without_the_libraries_panic(exported, tmp_path):
    """`(a|aa)+b` over 40 a's: the regex engine gives up (a Rust panic, PanicException, which is no
    Exception and passed `except Exception`); its own message on stderr is held back."""
    folder = tampered(exported, tmp_path, tokenizer=set_(
        "normalizer", {"type": "Replace", "pattern": {"Regex": "(a|aa)+b"}, "content": "x"}))
    message = refused(folder, "a" * 40)
    assert message.startswith("error: PROMPT: the model's tokenizer failed (") and "panicked" not in message


def test_a_tokenizer_that_does_not_finish_is_given_up_in_one_line(monkeypatch):
    """The time limit, with a tokenizer whose batch encoding never returns until released."""
    release = threading.Event()

    class Endless:
        def encode_batch(self, texts):
            release.wait()
            return []

    monkeypatch.setattr(received_model, "TOKENIZER_SECONDS", 0.5)
    try:
        with pytest.raises(WorkbenchError, match=r"PROMPT: the model's tokenizer did not finish within 0\.5 s"):
            received_model.bounded_encode(Endless(), "a")
    finally:
        release.set()


def test_a_run_folder_with_nan_weights_generates_nothing(tmp_path):
    folder = run_folder(tmp_path / "run", poison=True)
    assert f"{folder / FINAL_WEIGHTS}: decoder.blocks.0.attn.out.weight holds NaN" in refused(folder)


@pytest.mark.parametrize("options, message", [
    (["--max-new-tokens", "1000000000"], "1000000000 is not in the range 1<=x<=65536"),
    (["--seed", str(2**70)], f"{2**70} is not in the range 0<=x<=18446744073709551615"),
    (["--seed", "-1"], "-1 is not in the range"),
])
def test_options_without_a_natural_bound_are_bounded(exported, options, message):
    result = cli("generate", str(exported), PROMPT, *options)
    assert result.exit_code == 2 and message in result.output and "Traceback" not in result.output


def test_the_python_entry_bounds_them_too(exported):
    with pytest.raises(SpecError, match="--max-new-tokens: 1000000000: give 1 to 65536"):
        generation.decoding(10**9)
    with pytest.raises(SpecError, match="--seed: "):
        generation.generate(exported, PROMPT, generation.decoding(3), seed=2**70)


def test_a_kv_cache_past_half_the_memory_is_refused(monkeypatch):
    model = build_model(CONFIG["model"])
    pages = {"SC_PAGE_SIZE": 4096, "SC_PHYS_PAGES": 1024}  # a machine of 4 MiB
    monkeypatch.setattr(generation.os, "sysconf", pages.__getitem__)
    generation.check_cache_memory(model, 5, 1000)  # K and V: 2 x 2 layers x 2 heads x 8 x 1005 x 4 bytes, 0.25 MiB
    with pytest.raises(SpecError, match=r"--max-new-tokens: 65536: the KV cache of the prompt's 5 tokens and 65536 "
                                        r"new ones would take 0\.0156 GiB, over half of this machine's 0\.00391 GiB"):
        generation.check_cache_memory(model, 5, 65536)
