"""`workbench export RUN_DIR --to hf OUT` on a trained run: transformers' Auto class loads the
folder and computes our logits; a spec that does not map is refused, naming its field."""

from __future__ import annotations

import pytest
import torch
from click.testing import CliRunner

transformers = pytest.importorskip("transformers")

from workbench.cli import main  # noqa: E402
from workbench.model.weights import load_final_model  # noqa: E402

STUDY = """\
name: tiny-llama
task: {name: copy, train_length: 4, n_eval: 8, alphabet_size: 4}
model: {family: decoder, d_model: 16, n_layers: 2, n_heads: 4, n_kv_heads: 2, ffn: swiglu,
        norm: {name: pre, type: rmsnorm}, tie_embeddings: false}
train: {steps: 3, batch_size: 4, log_every: 1}
sweep: {model.position: [rope, sinusoidal]}
"""


def test_a_trained_run_exports_to_transformers_with_equal_logits(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "tiny.yaml").write_text(STUDY)
    assert CliRunner().invoke(main, ["run", "tiny.yaml", "--quiet"]).exit_code == 0
    runs = {load_final_model(d)[0].spec.position.name: d for d in (tmp_path / "runs" / "tiny-llama" / "runs").iterdir()}

    result = CliRunner().invoke(main, ["export", str(runs["rope"]), "--to", "hf", "exported"])
    assert result.exit_code == 0, result.output
    assert "AutoModelForCausalLM" in result.output
    loaded = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "exported").eval()
    assert type(loaded).__name__ == "LlamaForCausalLM"
    ours, _ = load_final_model(runs["rope"])
    x = torch.randint(2, ours.spec.vocab_size, (3, 10), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        mine, theirs = ours(x), loaded(input_ids=x).logits
    assert mine.abs().max() > 0.1  # trained weights, not zeros
    assert (mine - theirs).abs().max() < 1e-4

    refused = CliRunner().invoke(main, ["export", str(runs["sinusoidal"]), "--to", "hf", "refused"])
    assert refused.exit_code == 2
    assert "model.position" in refused.stderr and "Traceback" not in refused.output + refused.stderr
    assert not (tmp_path / "refused").exists()
    missing = CliRunner().invoke(main, ["export", str(tmp_path), "--to", "hf", "nowhere"])
    assert missing.exit_code == 2 and "no final weights" in missing.stderr
