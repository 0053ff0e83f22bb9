"""Several seeds as one batched model (`train.batch_seeds`): each seed's curves and final
metrics equal those of its run trained alone, to float rounding (checked at float64 on the CPU),
whether the members' losses go through vmap (batches of equal masks) or one call each (padded
batches, dropout drawn from each seed's own stream); a seed that diverges ends alone."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from workbench.api import run_study
from workbench.recipes.train.sweep import batched_trainings, expand
from workbench.results import Status
from workbench.run import batched
from workbench.run.executor import Job
from workbench.run.store import Store
from workbench.run.train import train_run
from workbench.study import load_study

STUDY = """\
name: tiny-batched
task: {name: reverse, train_length: 6, min_length: 3, eval_lengths: [6, 8], n_eval: 16, alphabet_size: 6}
model: {family: decoder, d_model: 16, n_layers: 1, n_heads: 2, position: rope, ffn: gelu}
train: {steps: 10, batch_size: 8, lr: 3.0e-3, warmup_steps: 2, eval_every: 5, log_every: 2, batch_seeds: 3}
seeds: [0, 1, 2]
"""


@pytest.fixture
def float64():
    before, threads = torch.get_default_dtype(), torch.get_num_threads()
    torch.set_default_dtype(torch.float64)
    torch.set_num_threads(1)
    yield
    torch.set_default_dtype(before)
    torch.set_num_threads(threads)


def batch_and_solo(tmp_path: Path, text: str):
    study = tmp_path / "study.yaml"
    study.write_text(text)
    runs = expand(load_study(study))
    [[first, *others]] = [[[run for run in training] for training in job] for job in batched_trainings(runs)]

    def job(training, folder):
        return Job(training[0].run_id, training[0].config, tmp_path / folder / training[0].run_id)

    together = Job(first[0].run_id, first[0].config, tmp_path / "batched" / first[0].run_id,
                   batch=tuple(job(t, "batched") for t in others))
    results = batched.train_batched(together)
    solo = [train_run(run.run_id, run.config, tmp_path / "solo" / run.run_id) for run in runs]
    return results, solo


def assert_equal_to_rounding(batched_result, solo_result):
    assert (batched_result.run_id, batched_result.status, batched_result.steps_done, batched_result.diverged_step) == (
        solo_result.run_id, solo_result.status, solo_result.steps_done, solo_result.diverged_step)
    assert batched_result.metrics.keys() == solo_result.metrics.keys()
    for name, value in solo_result.metrics.items():
        assert batched_result.metrics[name] == pytest.approx(value, rel=1e-9, abs=1e-12, nan_ok=True), name
    curves = [c for c in solo_result.curves if c[2] != "seconds"]
    mine = [c for c in batched_result.curves if c[2] != "seconds"]
    assert [c[:3] for c in mine] == [c[:3] for c in curves]
    for a, b in zip(mine, curves):
        assert a[3] == pytest.approx(b[3], rel=1e-9, abs=1e-12), a[:3]
    assert (batched_result.tokens, batched_result.train_flops) == (solo_result.tokens, solo_result.train_flops)


def test_padded_batches_train_each_seed_as_it_trains_alone(tmp_path, float64, monkeypatch):
    calls = []
    original = batched.BatchedRunModule.member_loss
    monkeypatch.setattr(batched.BatchedRunModule, "member_loss", lambda self, *a: calls.append(1) or original(self, *a))
    results, solo = batch_and_solo(tmp_path, STUDY)
    assert len(calls) == 3 * 10  # the model branches on the members' padding: one call per member and step
    assert [r.status for r in results] == [Status.FINISHED] * 3
    for mine, alone in zip(results, solo):
        assert_equal_to_rounding(mine, alone)
    assert results[0].metrics != results[1].metrics  # three seeds, three models


def test_dropout_draws_from_each_seeds_own_stream(tmp_path, float64):
    results, solo = batch_and_solo(tmp_path, STUDY.replace("ffn: gelu}", "ffn: gelu, dropout: 0.2}"))
    for mine, alone in zip(results, solo):
        assert_equal_to_rounding(mine, alone)


def test_batches_of_equal_masks_go_through_vmap(tmp_path, float64, monkeypatch):
    calls = []
    original = batched.BatchedRunModule.vmapped
    monkeypatch.setattr(batched.BatchedRunModule, "vmapped", lambda self, *a: calls.append(1) or original(self, *a))
    results, solo = batch_and_solo(tmp_path, STUDY.replace("min_length: 3", "min_length: 6"))  # no padding
    assert len(calls) == 10  # every step
    for mine, alone in zip(results, solo):
        assert_equal_to_rounding(mine, alone)


def test_auxiliary_losses_and_a_registered_optimizer_train_each_seed_as_alone(tmp_path, float64):
    """A mixture of experts adds its balance and z losses to each member's loss and curves (its
    routing has dynamic shapes, which vmap cannot batch: one call per member); SGD with momentum
    is built by its optimizer variant, as each run builds it."""
    text = (STUDY.replace("ffn: gelu}", "ffn: {name: moe, n_experts: 4, top_k: 2, expert: gelu, z_loss: 0.001}}")
            .replace("min_length: 3", "min_length: 6").replace("batch_seeds: 3}", "batch_seeds: 3, optimizer: sgd, lr: 0.1}")
            .replace("lr: 3.0e-3, ", ""))
    results, solo = batch_and_solo(tmp_path, text)
    assert {"aux.moe.balance", "aux.moe.router_z", "loss_total"} <= {c[2] for c in solo[0].curves}
    for mine, alone in zip(results, solo):
        assert_equal_to_rounding(mine, alone)


def test_a_seed_that_diverges_ends_alone_and_the_others_train_on(tmp_path, float64):
    text = STUDY.replace("lr: 3.0e-3", "lr: 3.0e-3, grad_clip: null").replace("seeds: [0, 1, 2]", "seeds: [0, 1]")
    study = tmp_path / "study.yaml"
    study.write_text(text)
    runs = expand(load_study(study))
    original = batched.BatchedRunModule.losses

    def poisoned(self, inputs, alive):  # seed 1's loss turns NaN at step 4
        losses, terms = original(self, inputs, alive)
        if self.global_step == 3 and 1 in alive:
            losses = losses.clone()
            losses[alive.index(1)] = math.nan
        return losses, terms

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(batched.BatchedRunModule, "losses", poisoned)
        results = batched.train_batched(Job(runs[0].run_id, runs[0].config, tmp_path / "b" / runs[0].run_id,
                                            batch=(Job(runs[1].run_id, runs[1].config, tmp_path / "b" / runs[1].run_id),)))
    assert [(r.status, r.diverged_step) for r in results] == [(Status.FINISHED, None), (Status.DIVERGED, 4)]
    assert results[1].steps_done == 3 and not results[1].metrics
    assert_equal_to_rounding(results[0], train_run(runs[0].run_id, runs[0].config, tmp_path / "solo"))


def test_a_study_with_batch_seeds_records_every_seed_under_its_own_id(tmp_path):
    torch.set_num_threads(1)
    study = tmp_path / "study.yaml"
    study.write_text(STUDY.replace("seeds: [0, 1, 2]", "seeds: [0, 1, 2, 3]"))
    runs = expand(load_study(study))
    assert [[len(t) for t in job] for job in batched_trainings(runs)] == [[1, 1, 1], [1]]  # 3 seeds, then 1
    summary = run_study(study, tmp_path / "out", quiet=True)
    assert summary.statuses == {"finished": 4}
    stored = Store(tmp_path / "out", create=False).runs()
    assert sorted(r["run_id"] for r in stored) == sorted(run.run_id for run in runs)
    assert sorted(r["environment"].get("batched_with", 1) for r in stored) == [1, 3, 3, 3]  # the fourth alone


def test_batch_seeds_refuses_what_each_seed_would_need_alone(tmp_path):
    from workbench.study.yaml_file import StudyError

    study = tmp_path / "study.yaml"
    study.write_text(STUDY.replace("batch_seeds: 3}", "batch_seeds: 3, early_stopping: {metric: loss@6, patience: 2}}"))
    with pytest.raises(StudyError, match="train.early_stopping: cannot be used with train.batch_seeds 3"):
        load_study(study)
    study.write_text(STUDY.replace("batch_seeds: 3}", "batch_seeds: 3, optimizer: muon}"))
    with pytest.raises(StudyError, match="train.optimizer: cannot be used with train.batch_seeds 3: muon updates each "
                                         "weight matrix as a whole.* element by element do: adam, adamw, lion, sgd"):
        load_study(study)


def test_a_batched_training_cut_short_resumes_every_seed_where_it_stopped(tmp_path, monkeypatch):
    torch.set_num_threads(1)
    study = tmp_path / "study.yaml"
    study.write_text(STUDY.replace("ffn: gelu}", "ffn: gelu, dropout: 0.1}").replace("seeds: [0, 1, 2]", "seeds: [0, 1]"))
    first, second = expand(load_study(study))

    def job(folder: str) -> Job:
        return Job(first.run_id, first.config, tmp_path / folder / first.run_id,
                   batch=(Job(second.run_id, second.config, tmp_path / folder / second.run_id),))

    reference = batched.train_batched(job("uninterrupted"))
    original = batched.BatchedRunModule.training_step

    def crash_at_7(self, batch, batch_idx):
        if self.global_step == 7:
            raise RuntimeError("simulated crash")
        return original(self, batch, batch_idx)

    monkeypatch.setattr(batched.BatchedRunModule, "training_step", crash_at_7)
    assert [r.status for r in batched.train_batched(job("resumed"))] == [Status.FAILED] * 2
    monkeypatch.setattr(batched.BatchedRunModule, "training_step", original)
    resumed = batched.train_batched(job("resumed"))
    assert [r.resumed_from_step for r in resumed] == [5, 5]  # the checkpoint at the evaluation of step 5
    for a, b in zip(reference, resumed):  # dropout streams and curves carried over: the same numbers
        assert a.metrics == b.metrics
        assert [c for c in a.curves if c[2] != "seconds"] == [c for c in b.curves if c[2] != "seconds"]
