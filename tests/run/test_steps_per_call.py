"""Several optimizer steps per call of the training step (workbench.run.batches.steps_per_call):
the Trainer's own work is paid once per call, and nothing a run records changes: a run taken K
steps a call equals the same run taken one step a call, to the last bit, with micro-batches,
dropout, auxiliary loss terms (a mixture of experts with a z-loss) and clipping."""

from __future__ import annotations

import pytest
import torch

from workbench.model.weights import load_final_model
from workbench.recipes.train.sweep import expand
from workbench.run import batches
from workbench.run.batches import steps_per_call
from workbench.run.train import train_run
from workbench.study import load_study

STUDY = """\
name: calls
task: {name: copy, train_length: 6, eval_lengths: [6], n_eval: 32, alphabet_size: 6}
model: {family: decoder, d_model: 32, n_layers: 1, n_heads: 2, position: rope, dropout: 0.1, FFN}
train: {steps: 24, batch_size: 8, lr: 3.0e-3, warmup_steps: 2, eval_every: 12, log_every: 4, grad_clip: 0.5, EXTRA}
seeds: [0]
"""
MOE = "ffn: {name: moe, n_experts: 4, top_k: 2, expert: {name: swiglu, d_ff: 16}, z_loss: 0.001}"


def config(tmp_path, ffn: str = "ffn: gelu", extra: str = "grad_accumulation: 1") -> dict:
    path = tmp_path / "calls.yaml"
    path.write_text(STUDY.replace("FFN", ffn).replace("EXTRA", extra))
    return expand(load_study(path))[0].config


def test_the_steps_per_call_divide_every_record_evaluation_checkpoint_and_the_last_step():
    train = {"steps": 1200, "log_every": 50, "eval_every": 250, "checkpoint_every": 250, "budget": None}
    assert steps_per_call(train, user_callbacks=False) == 10  # the quickstart's: gcd 50, at most 16
    assert steps_per_call({**train, "log_every": 48, "eval_every": 96, "checkpoint_every": 96}, False) == 16  # gcd 48
    assert steps_per_call({**train, "log_every": 36, "eval_every": 300, "checkpoint_every": 300}, False) == 12  # gcd 12
    assert steps_per_call({**train, "log_every": 7}, False) == 1  # gcd 1
    assert steps_per_call(train, user_callbacks=True) == 1  # a study's callbacks see every step
    assert steps_per_call({**train, "budget": {"flops": 1e12}}, False) == 1  # a budget cuts its last step


@pytest.mark.parametrize(("ffn", "extra"), [
    ("ffn: gelu", "grad_accumulation: 2"),  # micro-batches and dropout
    (MOE, "grad_accumulation: 1"),  # auxiliary terms, each its own curve
])
def test_k_steps_a_call_record_what_one_step_a_call_records(tmp_path, monkeypatch, ffn, extra):
    run = config(tmp_path, ffn, extra)
    together = train_run("k", run, tmp_path / "k")
    monkeypatch.setattr(batches, "MAX_STEPS_PER_CALL", 1)
    alone = train_run("one", run, tmp_path / "one")
    assert (together.environment["steps_per_call"], alone.environment["steps_per_call"]) == (4, 1)
    assert together.metrics == alone.metrics and together.metrics
    assert (together.tokens, together.train_flops, together.steps_done) == (alone.tokens, alone.train_flops, 24)
    assert together.peak_memory_bytes == alone.peak_memory_bytes > 0  # one step measured, not a call of 4
    curves = [[c for c in result.curves if c[1:3] != ("progress", "seconds")] for result in (together, alone)]
    assert curves[0] == curves[1]
    assert {c[2] for c in curves[0] if c[1] == "train"} >= ({"loss", "lr"} | ({"loss_total"} if "moe" in ffn else set()))
    a, _ = load_final_model(tmp_path / "k")
    b, _ = load_final_model(tmp_path / "one")
    for (name, p), q in zip(a.state_dict().items(), b.state_dict().values()):
        assert torch.equal(p, q), name
