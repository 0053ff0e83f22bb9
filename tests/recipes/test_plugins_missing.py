"""Which package provides each variant is recorded and checked on resume; a report of a folder
whose plugin was uninstalled is still written, leaving out only what needs the plugin's code."""

from __future__ import annotations

import pytest

from conftest import installed_plugin
from test_report import save_study
from workbench import registry
from workbench.errors import WorkbenchError
from workbench.model.position import PositionScheme
from workbench.api import write_report
from workbench.report import ReportSkipWarning
from workbench.run.runner import check_providers
from workbench.run.store import Store
from workbench.study import load_study
from workbench.recipes.train.sweep import expand
from workbench.results import RunResult

STUDY = """\
name: third-party
task: {name: copy, train_length: 6, n_eval: 8, alphabet_size: 6}
model: {family: decoder, d_model: 16, n_layers: 1, n_heads: 2}
train: {steps: 3, batch_size: 4}
seeds: [0, 1]
sweep: {model.position: [rope, my_nope]}
expect: [{metric: accuracy@6, better: my_nope, than: rope}]
"""


class MyNoPE(PositionScheme):
    """A third-party scheme that adds nothing."""

    name = "my_nope"


@pytest.fixture
def plugin():
    with installed_plugin("my_nope_plugin", register_position_schemes=[MyNoPE]) as module:
        yield module


def test_providers_are_recorded_and_a_changed_one_refuses_to_resume(tmp_path, plugin, monkeypatch):
    (tmp_path / "study.yaml").write_text(STUDY)
    runs = expand(load_study(tmp_path / "study.yaml"))
    providers = registry.run_providers(runs[0].config)
    assert providers["variant.position"].startswith("rope (transformer-workbench ")
    assert providers["variant.task"].startswith("copy (transformer-workbench ")
    store = Store(tmp_path / "out")
    check_providers(store, runs)
    check_providers(store, runs)  # unchanged: resumes
    monkeypatch.setitem(registry.PROVIDERS, MyNoPE.__module__, "my-nope-package 2.0")
    with pytest.raises(WorkbenchError, match=r"my_nope \(\S*test_plugins_missing\) -> my_nope \(my-nope-package 2.0\).*--fresh"):
        check_providers(store, runs)


def test_report_without_the_plugin_skips_only_the_pictures(tmp_path, plugin):
    (tmp_path / "study.yaml").write_text(STUDY)
    study_file = load_study(tmp_path / "study.yaml")
    store = Store(tmp_path / "out")
    save_study(store, study_file)
    for run in expand(study_file):
        acc = 0.5 + 0.1 * run.seed
        store.record(run, RunResult(run_id=run.run_id, status="finished", steps_done=3, n_params=100,
                                    metrics={"accuracy@6": acc, "loss@6": 1 - acc}, wall_time_s=1.0,
                                    curves=[(3, "train", "loss", 1.0)], environment={"device": "cpu"}))
    registry.plugin_manager().unregister(plugin)
    registry.variants.cache_clear()
    with pytest.warns(ReportSkipWarning, match=r"position 'my_nope' not installed: the report leaves out"):
        index = write_report(tmp_path / "out", tmp_path / "reports")
    text = (index.parent / "report.md").read_text()
    assert "my\\_nope is better than" in text and "accuracy@6" in text
    assert "my_nope" in (index.parent / "results.csv").read_text()
