"""What a run gives plugins beyond the model (issue 60): auxiliary loss terms that reach the
training loss and the curves but no evaluation metric, optimizers as a plugin axis with their own
parameter groups (Muon), and the provenance of an installed plugin's code."""

from __future__ import annotations

import importlib
import sys

import pytest
import torch

from conftest import build, installed_plugin, tiny_spec, tokens
from workbench.errors import WorkbenchError
from workbench.model.losses import add_loss, collect, record
from workbench.model.optimizers import Optimizer, OptimizerChain, build_optimizer, decay_groups, hidden_matrices
from workbench.recipes.train.sweep import expand
from workbench.registry import code_digest, run_providers
from workbench.run.run_module import RunModule
from workbench.run.runner import check_providers
from workbench.run.store import Store
from workbench.run.train import train_run
from workbench.study import load_study
from workbench.variants import Params

STUDY = """\
name: t
task: {name: copy, train_length: 8, n_eval: 16, alphabet_size: 8}
model: {family: decoder, d_model: 16, n_layers: 2, n_heads: 2, position: rope, ffn: FFN}
train: {steps: 12, batch_size: 8, log_every: 4, eval_every: 6, OPTIMIZER}
seeds: [0]
"""
MOE = "{name: moe, n_experts: 4, top_k: 2, expert: {name: swiglu, d_ff: 8}, z_loss: 0.001}"


def run_config(tmp_path, ffn: str = "gelu", optimizer: str = "optimizer: adamw", name: str = "t.yaml") -> dict:
    path = tmp_path / name
    path.write_text(STUDY.replace("FFN", ffn).replace("OPTIMIZER", optimizer))
    return expand(load_study(path))


# ---- auxiliary losses ------------------------------------------------------------------------


def test_terms_are_collected_only_inside_a_training_step():
    add_loss("ignored", torch.tensor(5.0))  # outside collect(): nothing, no error
    with collect() as terms:
        add_loss("balance", torch.tensor(2.0), weight=0.5)
        add_loss("balance", torch.tensor(4.0), weight=0.5)  # a second layer's: summed
        record("load", 1.0)
        record("load", 3.0)
    assert float(terms.total()) == 3.0
    assert {k: float(v) for k, v in terms.curves().items()} == {"aux.balance": 6.0, "stat.load": 2.0}


def test_the_training_loss_is_the_task_loss_plus_the_weighted_terms(tmp_path):
    config = run_config(tmp_path, ffn=MOE)[0].config
    from workbench.model.weights import make_task
    task = make_task(config)
    module = RunModule(config, task)
    batch = task.train_batch(0, 8, "decoder")
    with collect() as terms:
        task_loss = task.loss(module.model, batch, "decoder")
    total = module.loss(batch)
    assert float(total.detach()) == pytest.approx(float((task_loss + terms.total()).detach()), rel=1e-6)
    assert float(terms.total().detach()) > 0 and set(module.step_terms) >= {"task_loss", "aux.moe.balance", "aux.moe.router_z"}
    total.backward()  # the balance loss reaches the router
    assert module.model.decoder.blocks[0].ffn.router.weight.grad.abs().sum() > 0
    with torch.no_grad():  # and no evaluation metric sees a term
        assert task.evaluate(module.model, [batch], "decoder")["loss"] == pytest.approx(float(task_loss), rel=1e-5)


def test_a_run_records_each_term_as_a_curve_and_its_task_loss_as_the_loss(tmp_path):
    run = run_config(tmp_path, ffn=MOE)[0]
    result = train_run(run.run_id, run.config, tmp_path / "run")
    assert result.status == "finished", result.error
    train_curves = {(step, metric): value for step, split, metric, value in result.curves if split == "train"}
    assert {m for _, m in train_curves} >= {"loss", "loss_total", "aux.moe.balance", "aux.moe.router_z",
                                           "stat.moe.load_max", "stat.moe.dropped"}
    for step in (4, 8, 12):
        expected = train_curves[step, "loss"] + 0.01 * train_curves[step, "aux.moe.balance"] \
            + 0.001 * train_curves[step, "aux.moe.router_z"]
        assert train_curves[step, "loss_total"] == pytest.approx(expected, rel=1e-4)
    assert 1.0 <= train_curves[12, "stat.moe.load_max"] <= 4.0
    assert "aux.moe.balance@8" not in result.metrics and "loss@8" in result.metrics


# ---- optimizers ------------------------------------------------------------------------------


def test_muon_takes_the_blocks_matrices_and_adamw_the_rest():
    model = build(tiny_spec(n_layers=2, ffn="swiglu", position={"name": "learned", "max_len": 16}))
    hidden, rest = hidden_matrices(model)
    named = {id(p): name for name, p in model.named_parameters()}
    assert sorted(named[id(p)] for p in hidden) == sorted(
        f"decoder.blocks.{i}.{m}" for i in (0, 1) for m in ("attn.qkv.weight", "attn.out.weight",
                                                              "ffn.gate_up.weight", "ffn.down.weight"))
    assert {named[id(p)] for p in rest} >= {"embedding.weight", "decoder.position.table.weight",
                                            "decoder.blocks.0.attn_norm.norm.weight", "decoder.final_norm.weight"}
    optimizer = build_optimizer({"name": "muon"}, model, lr=0.01, weight_decay=0.1)
    assert isinstance(optimizer, OptimizerChain)
    assert [type(o).__name__ for o in optimizer.optimizers] == ["Muon", "AdamW"]
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 0.5)
    assert {group["lr"] for group in optimizer.param_groups} == {0.005}  # the schedule reaches every group
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    model(tokens(2, 6)).logsumexp(-1).mean().backward()
    optimizer.step()
    scheduler.step()
    moved = {name for name, p in model.named_parameters() if not torch.equal(p, before[name])}
    assert {"decoder.blocks.0.attn.qkv.weight", "embedding.weight"} <= moved
    again = build_optimizer({"name": "muon"}, model, lr=0.01, weight_decay=0.1)
    again.load_state_dict(optimizer.state_dict())  # a checkpoint's round trip
    assert again.optimizers[0].state_dict()["state"].keys() == optimizer.optimizers[0].state_dict()["state"].keys()


def test_a_run_trains_with_muon_and_a_sweep_compares_optimizers(tmp_path):
    runs = run_config(tmp_path, optimizer="optimizer: muon")
    result = train_run(runs[0].run_id, runs[0].config, tmp_path / "muon")
    assert result.status == "finished", result.error
    losses = [v for _, split, m, v in result.curves if split == "train" and m == "loss"]
    assert losses[-1] < losses[0]
    swept = (tmp_path / "s.yaml")
    swept.write_text(STUDY.replace("FFN", "gelu").replace(", OPTIMIZER", "") + "sweep: {train.optimizer: [adamw, muon]}\n")
    ids = [r.run_id for r in expand(load_study(swept))]
    plain = (tmp_path / "p.yaml")
    plain.write_text(STUDY.replace("FFN", "gelu").replace(", OPTIMIZER", ""))
    assert len(set(ids)) == 2 and ids[0] == expand(load_study(plain))[0].run_id  # adamw, the default: the same id


class HalfSGD(Optimizer):
    """Plain SGD at half the rate: a plugin optimizer of a test."""

    name = "half_sgd"
    Params = Params

    def build(self, model, *, lr, weight_decay):
        return torch.optim.SGD(decay_groups(list(model.parameters()), weight_decay), lr=lr / 2)


def test_a_plugin_optimizer_is_named_like_a_built_in(tmp_path):
    with installed_plugin("optimizer_plugin", register_optimizers=[HalfSGD]):
        runs = run_config(tmp_path, optimizer="optimizer: half_sgd")
        assert runs[0].config["train"]["optimizer"] == {"name": "half_sgd"}
        model = build(tiny_spec())
        assert build_optimizer({"name": "half_sgd"}, model, lr=0.1, weight_decay=0.0).param_groups[0]["lr"] == 0.05
        with pytest.raises(WorkbenchError, match="train.optimizer.momentum: not an argument of half_sgd"):
            run_config(tmp_path, optimizer="optimizer: {name: half_sgd, momentum: 0.5}")
    with pytest.raises(WorkbenchError, match="unknown optimizer 'half_sgd'"):
        run_config(tmp_path, optimizer="optimizer: half_sgd")


# ---- provenance of a plugin's code -----------------------------------------------------------

PLUGIN_SOURCE = '''\
from workbench.model.ffn import MLP


class EditedFFN(MLP):
    """An MLP from a plugin whose file a test edits."""

    name = "edited_ffn"
    activation = __import__("torch").nn.{activation}
'''


def test_an_edited_plugin_is_recorded_and_a_rerun_into_its_folder_is_refused(tmp_path, monkeypatch):
    source = tmp_path / "edited_plugin.py"
    source.write_text(PLUGIN_SOURCE.format(activation="ReLU"))
    monkeypatch.syspath_prepend(str(tmp_path))
    module = importlib.import_module("edited_plugin")
    try:
        with installed_plugin("edited_ffn_plugin", register_ffn_types=[module.EditedFFN]):
            runs = run_config(tmp_path, ffn="edited_ffn")
            first = code_digest(module.EditedFFN)
            assert run_providers(runs[0].config)["code.ffn.edited_ffn"] == first
            assert code_digest(build(tiny_spec()).decoder.blocks[0].ffn.__class__) is None  # the workbench's own
            store = Store(tmp_path / "out")
            store.save_study({"name": "t"})
            check_providers(store, runs)  # recorded
            source.write_text(PLUGIN_SOURCE.format(activation="GELU"))  # an editable install, edited
            importlib.reload(module)
        with installed_plugin("edited_ffn_plugin", register_ffn_types=[module.EditedFFN]):
            assert code_digest(module.EditedFFN) != first
            with pytest.raises(WorkbenchError, match=r"the code of ffn edited_ffn \(.+ -> .+\)"):
                check_providers(store, run_config(tmp_path, ffn="edited_ffn"))
    finally:
        sys.modules.pop("edited_plugin", None)
