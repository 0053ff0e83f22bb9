"""Metric declarations (workbench.results.Metric): every shipped task's metrics keep the direction
and range they were shipped with, and every reader (reports, tuning, early stopping) asks them."""

from __future__ import annotations

import math

import pytest

from workbench.errors import WorkbenchError
from workbench.registry import get_variant
from workbench.recipes.train.runs import metric_direction, metric_range

INF = math.inf
SHARE = (0.0, 1.0)
# Each shipped task's metrics (in order: the first is its primary one) with (higher is better, range).
SHIPPED = {
    "classify": {"accuracy": (True, SHARE)},
    "copy": {"accuracy": (True, SHARE), "exact_match": (True, SHARE), "symbol_accuracy": (True, SHARE)},
    "difference": {"accuracy": (True, SHARE), "exact_match": (True, SHARE), "symbol_accuracy": (True, SHARE)},
    "passkey": {"accuracy": (True, SHARE), "exact_match": (True, SHARE)},
    "recall": {"accuracy": (True, SHARE), "exact_match": (True, SHARE)},
    "reverse": {"accuracy": (True, SHARE), "exact_match": (True, SHARE), "symbol_accuracy": (True, SHARE)},
    "sort": {"accuracy": (True, SHARE), "exact_match": (True, SHARE), "symbol_accuracy": (True, SHARE)},
    "text_lm": {"bpc": (False, (0.0, INF)), "bpc_tail": (False, (-INF, INF)), "perplexity": (False, (1.0, INF)),
                "distinct_2": (True, SHARE), "repetition_4": (False, SHARE)},
    "translate": {"bleu": (True, (0.0, 100.0)), "accuracy": (True, SHARE), "exact_match": (True, SHARE)},
}


@pytest.mark.parametrize("name", sorted(SHIPPED))
def test_every_shipped_task_metric_keeps_its_direction_and_range(name):
    task = get_variant("task", name)
    assert list(task.metrics) == list(SHIPPED[name])
    for metric, (higher, bounds) in {**SHIPPED[name], "loss": (False, (0.0, INF))}.items():
        at_length = f"{metric}@64"
        assert task.metric(at_length).higher_is_better is higher, metric
        assert task.metric(metric).range == bounds, metric
        # the report reads the same declaration
        assert (metric_direction(at_length, name), metric_range(at_length, name)) == (higher, bounds), metric


def test_run_measures_targets_and_failure_shares_keep_their_directions():
    higher = {"tokens_per_s": True, "peak_memory_bytes": False, "n_params": False, "wall_time_s": False,
              "train_time_s": False, "failure_share": False, "flops_to_target: bpc@32 ≤ 2.5": False,
              "tokens_to_target: accuracy@8 ≥ 0.9": False}
    assert {m: metric_direction(m, "copy") for m in higher} == higher
    assert metric_range("failure_share", "copy") == SHARE and metric_range("tokens_per_s", "copy") == (0.0, INF)
    assert metric_direction("attention_entropy@8", "copy") is None  # descriptive: neither end is better


def test_a_task_no_longer_installed_reads_the_built_in_declarations():
    assert (metric_direction("bpc@64", "no-such-task"), metric_range("bpc@64", "no-such-task")) == (False, (0.0, INF))
    assert metric_direction("repetition_4@64", "no-such-task") is False  # its name says nothing of its direction


def test_a_metric_the_task_does_not_declare_is_named_with_what_it_reports():
    with pytest.raises(WorkbenchError, match=r"task 'copy' declares no metric 'bleu'; it reports accuracy, "
                                             r"exact_match, symbol_accuracy, loss"):
        get_variant("task", "copy").metric("bleu@8")


def test_a_metric_of_a_task_no_longer_installed_and_not_built_in_is_an_error_not_a_guess():
    with pytest.raises(WorkbenchError, match=r"my_score@8: task 'no-such-task', which declares it, is not installed"):
        metric_direction("my_score@8", "no-such-task")
