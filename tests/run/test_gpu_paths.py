"""The training hot path without host syncs, and a run on a GPU.

On a GPU a read of a tensor's value (`.item()`, `bool()`, a boolean-mask selection whose size
is data) makes the host wait for the device; the training step avoids them. The CPU checks
that the sync-free forms compute what the indexed forms did; the CUDA test (skipped here, run
on a GPU machine) trains a run and catches a diverging one through the deferred check."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from workbench import build_model
from workbench.results import Status
from workbench.run.train import train_run
from workbench.study import load_study
from workbench.recipes.train.sweep import expand
from workbench.tasks import Tally
from workbench.model.weights import make_task

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

STUDY = """\
name: gpu-paths
task: {name: copy, train_length: 6, eval_lengths: [6], n_eval: 32, alphabet_size: 6}
model: {family: decoder, d_model: 64, n_layers: 1, n_heads: 4, position: rope}
train: {steps: 30, batch_size: 16, lr: 3.0e-3, eval_every: 15, log_every: 5, ACCELERATOR}
seeds: [0]
sweep:
  train.lr: [3.0e-3, 1.0e+6]
"""


def runs(tmp_path, accelerator: str):
    path = tmp_path / "study.yaml"
    path.write_text(STUDY.replace("ACCELERATOR", accelerator))
    return expand(load_study(path))


def test_the_training_loss_is_the_mean_over_scored_tokens_without_selecting_them(tmp_path):
    run = runs(tmp_path, "accelerator: cpu")[0]
    task, model = make_task(run.config), build_model(run.config["model"])
    batch = task.train_batch(0, 16, "decoder")
    logits, targets, mask = task.scored(model, batch, "decoder")
    selected = F.cross_entropy(logits[mask].float(), targets[mask])  # the form that syncs on a GPU
    torch.testing.assert_close(task.loss(model, batch, "decoder"), selected, rtol=1e-6, atol=1e-6)


def test_tally_sums_on_the_device_and_reads_once():
    logits = torch.randn(3, 5, 7)
    targets = torch.randint(0, 7, (3, 5))
    mask = torch.rand(3, 5) > 0.3
    tally = Tally()
    for rows in (slice(0, 2), slice(2, 3)):
        tally.add(logits[rows], targets[rows], mask[rows])
    right = (logits.argmax(-1) == targets) & mask
    nll = F.cross_entropy(logits[mask], targets[mask], reduction="sum")
    scores = tally.scores()
    assert scores["accuracy"] == pytest.approx(float(right.sum() / mask.sum()))
    assert scores["loss"] == pytest.approx(float(nll / mask.sum()), rel=1e-6)


@needs_cuda
def test_a_run_on_the_gpu_finishes_and_a_diverging_one_is_recorded_at_its_first_bad_step(tmp_path):
    """bf16-mixed on CUDA: the divergence check reads each step's flag once its copy to pinned
    memory is done, not in the step; the diverging run is still found and recorded diverged."""
    sane, wild = runs(tmp_path, "accelerator: gpu, precision: bf16-mixed")
    finished = train_run(sane.run_id, sane.config, tmp_path / "sane")
    assert finished.status == Status.FINISHED, finished.error
    assert finished.steps_done == 30 and finished.peak_memory_instrument == "cuda_max_allocated"
    diverged = train_run(wild.run_id, wild.config, tmp_path / "wild")
    assert diverged.status == Status.DIVERGED, diverged.error
    assert 1 <= diverged.diverged_step <= 30
