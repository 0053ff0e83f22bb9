"""Figure details users read: per-panel colorbars, colour-blind-safe colours, bands inside a
metric's range, memory in KiB/MiB/GiB, and legends that name the swept key."""

from __future__ import annotations

import itertools
import math

import matplotlib.collections
import matplotlib.colors
import numpy as np
import pandas as pd
import pytest

from workbench.report import figures


@pytest.fixture
def drawn(monkeypatch):
    """Figures as drawn (not saved): save() keeps them for inspection."""
    kept = []

    def keep(fig, path):
        fig.canvas.draw()
        kept.append(fig)
        return path

    monkeypatch.setattr(figures, "save", keep)
    return kept


def test_panels_with_their_own_scale_get_their_own_colorbar(drawn, tmp_path):
    panels = [("head 0", -np.arange(16.0).reshape(4, 4)), ("head 3", -0.01 * np.arange(16.0).reshape(4, 4))]
    ticks = list("abcd")
    figures.heatmaps(panels, tmp_path / "a.png", x_tokens=ticks, y_tokens=ticks, xlabel="k", ylabel="q", title="t",
                     vmin=None, vmax=0.0)
    colorbars = [ax for ax in drawn[0].axes if ax.get_label() == "<colorbar>"]
    assert len(colorbars) == 2
    assert sorted(round(cb.get_ylim()[0], 2) for cb in colorbars) == [-15.0, -0.15]
    figures.heatmaps(panels[:1] * 2, tmp_path / "b.png", x_tokens=ticks, y_tokens=ticks, xlabel="k", ylabel="q",
                     title="t")  # a shared 0..1 scale: one colorbar
    assert len([ax for ax in drawn[1].axes if ax.get_label() == "<colorbar>"]) == 1


def test_heatmap_panels_name_their_shared_tokens_once_per_row_and_column(drawn, tmp_path):
    """Six panels in rows of four: the tokens on the left of each row and under the lowest panel
    of each column (row 0's last two panels have none below them)."""
    ticks = list("abcd")
    panels = [(f"head {h}", np.eye(4)) for h in range(6)]
    figures.heatmaps(panels, tmp_path / "a.png", x_tokens=ticks, y_tokens=ticks, xlabel="key", ylabel="query", title="t")
    axes = [ax for ax in drawn[0].axes if ax.get_label() != "<colorbar>" and ax.get_visible()]

    def shown(labels):
        return [t.get_text() for t in labels if t.get_visible() and t.get_text()]

    assert [shown(ax.get_yticklabels()) == ticks for ax in axes] == [True, False, False, False, True, False]
    assert [ax.get_ylabel() for ax in axes] == ["query", "", "", "", "query", ""]
    assert [shown(ax.get_xticklabels()) == ticks for ax in axes] == [False, False, True, True, True, True]
    assert [ax.get_xlabel() for ax in axes] == ["", "", "key", "key", "key", "key"]


def test_palette_keeps_the_given_order_and_neighbours_apart():
    labels = [f"v{i}" for i in range(8)]
    palette = figures.variant_palette(labels)
    assert list(palette) == labels
    assert [matplotlib.colors.to_hex(c).upper() for c in palette.values()] == list(figures.OKABE_ITO)
    for a, b in itertools.combinations(palette.values(), 2):
        assert np.abs(np.subtract(a, b)).sum() > 0.25


def test_bands_stay_inside_the_metric_range():
    near_one = pd.Series([0.97, 1.0, 1.0])
    assert figures.t_band(near_one)[1] > 1.0  # the raw t interval leaves [0, 1] ...
    assert figures.band((0.0, 1.0))(near_one)[1] == 1.0  # ... the drawn band does not
    assert figures.band((0.0, math.inf))(pd.Series([0.001, 0.2, 0.01]))[0] == 0.0
    assert figures.band(figures.UNBOUNDED)(near_one) == figures.t_band(near_one)


def curve_rows(values: dict[str, list[list[float]]], metric: str) -> pd.DataFrame:
    """{variant: [one list of values per seed]} -> long rows at steps 10, 20, ..."""
    return pd.DataFrame([{"variant": v, "seed": seed, "step": 10 * (i + 1), "metric": metric, "value": x}
                         for v, seeds in values.items() for seed, xs in enumerate(seeds) for i, x in enumerate(xs)])


def test_learning_curves_show_each_seed_and_keep_the_band_in_range(drawn, tmp_path):
    near_zero = {"a": [[0.0, 0.01, 0.3], [0.0, 0.0, 0.02], [0.2, 0.0, 0.01], [0.0, 0.0, 0.0], [0.01, 0.0, 0.0]],
                 "b": [[0.5, 0.9, 1.0], [0.4, 1.0, 1.0], [0.9, 1.0, 0.95], [0.6, 1.0, 1.0], [0.5, 0.95, 1.0]]}
    curves = curve_rows(near_zero, "eval symbol_accuracy@6")
    figures.learning_curves(curves, figures.variant_palette(["a", "b"]), tmp_path / "l.png",
                            panels=["eval symbol_accuracy@6"], bounds={"eval symbol_accuracy@6": (0.0, 1.0)})
    ax = drawn[0].axes[0]
    seed_lines = [line for line in ax.lines if line.get_linewidth() == 0.7]
    assert len(seed_lines) == 10  # 2 variants x 5 seeds (enough for a band), beside the two means
    bands = np.concatenate([p.get_paths()[0].vertices for p in ax.collections])
    assert bands[:, 1].min() >= 0.0 and bands[:, 1].max() <= 1.0  # the raw t band would pass both ends


def test_a_metric_equal_everywhere_is_not_drawn(drawn, tmp_path):
    flat = curve_rows({"a": [[0.0, 0.0], [0.0, 0.0]], "b": [[0.0, 0.0], [0.0, 0.0]]}, "eval exact_match@6")
    loss = curve_rows({"a": [[2.0, 1.0], [2.1, 1.1]], "b": [[2.0, 0.5], [1.9, 0.6]]}, "train loss")
    palette = figures.variant_palette(["a", "b"])
    figures.learning_curves(pd.concat([flat, loss]), palette, tmp_path / "l.png",
                            panels=["train loss", "eval exact_match@6"])
    assert [ax.get_title() for ax in drawn[0].axes] == ["train loss"]
    by_length = pd.DataFrame({"variant": ["a", "a", "b", "b"], "seed": 0, "length": [6, 12, 6, 12], "value": 0.0})
    assert figures.quality_vs_length(by_length, palette, tmp_path / "x.png", metric="exact_match") is None
    assert figures.learning_curves(flat, palette, tmp_path / "f.png", panels=["eval exact_match@6"]) is None


def cost_figure(drawn, tmp_path, cost: str, values: list[float], label: str):
    summary = pd.DataFrame({"variant": ["a", "b"], "mean": [0.5, 0.9], "ci_lo": [0.4, 0.8], "ci_hi": [0.6, 1.1],
                            cost: values})
    seeds = pd.DataFrame({"variant": ["a", "a", "b", "b"], "value": [0.45, 0.55, 0.85, 0.95],
                          cost: [values[0], values[0], values[1], values[1]]})
    figures.quality_vs_cost(summary, figures.variant_palette(["a", "b"]), tmp_path / f"{cost}.png", metric="accuracy@8",
                            cost=cost, cost_label=label, bounds=(0.0, 1.0), seeds=seeds)
    return drawn[-1].axes[0]


def test_memory_axes_read_in_binary_units(drawn, tmp_path):
    ax = cost_figure(drawn, tmp_path, "peak_memory_bytes", [300 * 2**20, 3.5 * 2**30], "peak memory (bytes)")
    ticks = [t.get_text() for t in ax.get_xticklabels() if t.get_text()]
    assert ticks and all(t.endswith(("KiB", "MiB", "GiB")) for t in ticks), ticks  # a wide range: log, in units
    assert "bytes" not in ax.get_xlabel() and "e+" not in "".join(ticks)
    top = max(line.get_ydata().max() for line in ax.lines)
    assert top <= 1.0  # the interval of b (0.8..1.1) is drawn up to 1.0
    dots = [c for c in ax.collections if isinstance(c, matplotlib.collections.PathCollection)]
    assert sum(len(c.get_offsets()) for c in dots) == 4  # each seed's own dot


def test_a_small_memory_difference_is_drawn_to_scale(drawn, tmp_path):
    ax = cost_figure(drawn, tmp_path, "peak_memory_bytes", [1.00 * 2**20, 1.04 * 2**20], "peak memory (bytes)")
    assert ax.get_xscale() == "linear" and ax.get_xlim()[0] == 0  # 4% of the axis, not all of it
    ticks = [t.get_text() for t in ax.get_xticklabels() if t.get_text()]
    assert len(ticks) >= 4 and ax.get_xlabel() == "peak memory (MiB)"


def test_cost_figures_have_their_own_titles_and_plain_log_ticks(drawn, tmp_path):
    time_ax = cost_figure(drawn, tmp_path, "wall_time_s", [3.0, 140.0], "wall time per run (s)")
    memory_ax = cost_figure(drawn, tmp_path, "peak_memory_bytes", [2**20, 1.1 * 2**20], "peak memory (bytes)")
    assert time_ax.get_title() == "accuracy@8 against wall time per run"
    assert memory_ax.get_title() == "accuracy@8 against peak memory"
    labels = [t.get_text() for t in time_ax.get_xticklabels(minor=True) + time_ax.get_xticklabels() if t.get_text()]
    assert labels and not any("times" in t or "^" in t or "×" in t for t in labels), labels


def test_a_legend_names_the_swept_key_with_each_value(drawn, tmp_path):
    from workbench.report.sweep_points import Variants

    runs = pd.DataFrame({"model.n_kv_heads": [1, 4]})
    variants = Variants.of(["model.n_kv_heads"], runs, {"model.n_kv_heads": [4, 1]})
    assert variants.labels == ["n_kv_heads=4", "n_kv_heads=1"]  # never a bare "4"
    # the scaling report converts bytes to a unit first (recipes/scaling/report.py, in_unit): 1 and 2 MiB
    name = f"{variants.labels[1]} (KV cache)"
    rows = pd.DataFrame({"variant": [name] * 2, "length": [64, 128], "kv_cache_bytes": [1.0, 2.0]})
    figures.loglog(rows, {name: (0, 0, 0)}, tmp_path / "d.png", y="kv_cache_bytes", ylabel="KV-cache size (MiB)",
                   title="t")
    ax = drawn[0].axes[0]
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["n_kv_heads=1 (KV cache)"]
    ticks = [t.get_text() for t in ax.get_yticklabels() if t.get_text()]
    assert ticks and not any("^" in t or "e+" in t for t in ticks), ticks  # plain numbers on a log axis


def test_position_pictures_are_named_after_the_scheme_not_the_swept_ffn(tmp_path):
    import torch

    from workbench import build_model
    from workbench.recipes.train.report.pictures import ModelPictures
    from workbench.report.sweep_points import Variants
    from workbench.study import load_study
    from workbench.recipes.train.sweep import expand

    (tmp_path / "s.yaml").write_text(
        "name: ffns\ntask: {name: copy, train_length: 4, n_eval: 8, alphabet_size: 4}\n"
        "model: {family: decoder, d_model: 16, n_layers: 1, n_heads: 2, position: sinusoidal}\n"
        "train: {steps: 2, batch_size: 4}\nsweep: {model.ffn: [gelu, relu]}\n")
    runs = expand(load_study(tmp_path / "s.yaml"))
    configs = {run.run_id: run.config for run in runs}
    finished = pd.DataFrame({"run_id": list(configs), "seed": 0, "variant": ["ffn=gelu", "ffn=relu"],
                             "model.ffn": ["gelu", "relu"]})
    torch.manual_seed(0)
    pictures = ModelPictures(lambda run_id: tmp_path / run_id,
                             load=lambda folder: (build_model(configs[folder.name]["model"]).eval(), configs[folder.name]))
    items = pictures(Variants.of(["model.ffn"], finished), finished, tmp_path)
    paths = [item.path for item in items if getattr(item, "path", "").startswith("figures/position")]
    assert paths == ["figures/position_sinusoidal.png"]  # one scheme, drawn once, named after itself


def test_a_score_bias_picture_takes_its_range_and_caption_from_the_scheme(tmp_path, monkeypatch):
    """A learned bias of both signs (T5-style relative buckets) is drawn on a scale that holds
    its positive values, and captioned in its own words, not ALiBi's."""
    import torch
    from torch import nn

    from workbench.model.position import PositionScheme
    from workbench.recipes.train.report.pictures import ModelPictures

    class SignedBias(PositionScheme):
        name = "signed_bias"
        has_score_bias = True
        picture_note = "a learned bias per offset bucket"

        def score_bias(self, rel):
            per_head = torch.linspace(-1.0, 1.0, self.n_heads).view((1, self.n_heads) + (1,) * (rel.dim() - 2))
            return per_head * torch.cos(rel.float())  # [B, h, ...], values in [-1, 1]

    drawn = {}

    def keep(panels, path, **kwargs):
        drawn.update(kwargs, values=np.stack([m for _, m in panels]))
        return path

    monkeypatch.setattr(figures, "heatmaps", keep)
    model = nn.ModuleList([SignedBias(None, d_model=8, n_heads=2, head_dim=4)])
    items = ModelPictures(lambda run_id: tmp_path).position_items(model, tmp_path, "signed_bias", "run 0")
    assert drawn["values"].max() > 0.5
    assert drawn["vmin"] <= drawn["values"].min() and drawn["vmax"] >= drawn["values"].max()
    assert drawn["vmin"] == -drawn["vmax"]  # both signs: centred on 0
    assert "a learned bias per offset bucket" in items[0].caption
    assert "linear penalty" not in items[0].caption


@pytest.mark.parametrize("seeds, band", [(2, False), (4, False), (5, True)])
def test_curves_of_few_seeds_show_each_seed_and_the_mean_without_a_t_band(drawn, tmp_path, seeds, band):
    """Two seeds far apart: a t band would span 12.7 standard errors, hiding the curves, so below
    5 seeds per variant each seed is a thin line beside the mean and no band is filled."""
    rng = np.random.default_rng(0)
    rows = [{"variant": v, "seed": s, "step": step, "metric": "train loss", "value": 1 + s + rng.random() / step}
            for v in ("n_kv_heads=4", "n_kv_heads=1") for s in range(seeds) for step in (1, 2, 3)]
    curves = pd.DataFrame(rows)
    palette = figures.variant_palette(["n_kv_heads=4", "n_kv_heads=1"])
    figures.learning_curves(curves, palette, tmp_path / "c.png", panels=["train loss"])
    ax = drawn[0].axes[0]
    filled = [c for c in ax.collections if isinstance(c, matplotlib.collections.PolyCollection)]
    assert bool(filled) == band
    thin = [line for line in ax.lines if line.get_linewidth() < 1]
    assert len(thin) == 2 * seeds  # every seed of every variant drawn
    assert ("with a 95% t band" in figures.spread_text(curves)) == band


def test_a_verdict_figure_shows_every_seed_the_mean_interval_the_threshold_and_the_baseline(drawn, tmp_path):
    from workbench.recipes.train.report.verdict_figure import verdict_groups

    palette = figures.variant_palette(["position=rope", "position=none"])
    groups = [("position=none", [0.42, 0.41, 0.44], 0.4256, 0.399, 0.452),
              ("position=rope", [1.0, 0.995, 1.0], 0.998, 0.992, 1.04)]
    verdict_groups(groups, palette, tmp_path / "v.png", metric="accuracy@12", bounds=(0.0, 1.0),
                           threshold=0.499, baseline=("order-blind", 0.443))
    ax = drawn[0].axes[0]
    dots = [c for c in ax.collections if isinstance(c, matplotlib.collections.PathCollection)]
    assert sorted(len(c.get_offsets()) for c in dots) == [3, 3]  # every seed of both groups
    levels = sorted(line.get_ydata()[0] for line in ax.lines if line.get_linestyle() in ("--", ":"))
    assert levels == [0.443, 0.499]  # the strongest baseline and the learned-at-all threshold
    caps = [seg for c in ax.collections if isinstance(c, matplotlib.collections.LineCollection) for seg in c.get_segments()]
    assert max(point[1] for seg in caps for point in seg) <= 1.0  # the interval kept inside the metric's range
    assert [t.get_text() for t in ax.get_xticklabels()] == ["position=none", "position=rope"]
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["learned: ≥ 0.499", "order-blind 0.443"]


def test_a_verdict_figure_stacks_the_keys_of_a_multi_key_group_label(drawn, tmp_path):
    from workbench.recipes.train.report.verdict_figure import verdict_groups

    labels = ["n_heads=1, position=rope", "attention=full(scaled=True, window=4), lr=0.003"]
    groups = [(label, [0.5, 0.6], 0.55, 0.4, 0.7) for label in labels]
    verdict_groups(groups, figures.variant_palette(labels), tmp_path / "v.png", metric="accuracy@12")
    ticks = [t.get_text() for t in drawn[0].axes[0].get_xticklabels()]
    assert ticks == ["n_heads=1\nposition=rope", "attention=full(scaled=True, window=4)\nlr=0.003"]


def test_a_verdict_figure_for_a_lower_is_better_metric_reads_its_threshold_as_at_most(drawn, tmp_path):
    from workbench.recipes.train.report.verdict_figure import verdict_groups

    palette = figures.variant_palette(["position=rope", "position=none"])
    groups = [("position=none", [2.1, 2.2], 2.15, 2.0, 2.3), ("position=rope", [1.6, 1.7], 1.65, 1.5, 1.8)]
    verdict_groups(groups, palette, tmp_path / "v.png", metric="bpc@64", threshold=1.74,
                   baseline=("bigram", 1.9), higher_is_better=False)  # bpc: lower is better
    assert [t.get_text() for t in drawn[0].axes[0].get_legend().get_texts()] == ["learned: ≤ 1.74", "bigram 1.9"]


def test_attention_captions_of_a_bpe_text_task_show_decoded_text_not_byte_level_pieces(tmp_path):
    import torch

    from workbench import build_model
    from workbench.recipes.train.report.pictures import ModelPictures
    from workbench_plugins.task_text_lm import TextLM, TextParams

    root = tmp_path / "corpus"
    root.mkdir()
    for i in range(6):  # line breaks and indented code: BPE pieces carry Ċ and Ġ for them
        (root / f"doc{i}.py").write_text("".join(f"def f{i}_{j}(x):\n        return x + {j}\n" for j in range(60)))
    task = TextLM(TextParams(path=str(root), tokenizer="bpe", vocab_size=300, train_length=16, n_eval=4,
                             decode_samples=0), seed=0)
    torch.manual_seed(0)
    model = build_model({"family": "decoder", "d_model": 16, "n_layers": 1, "n_heads": 2,
                         "vocab_size": len(task.vocab)}).eval()
    items = ModelPictures(lambda run_id: tmp_path).attention_items(model, task, "decoder", tmp_path, "v", "v, seed 0")
    caption = next(item.caption for item in items if "self-attention" in getattr(item, "caption", ""))
    sample = task.sample("decoder")
    pieces = sample["batch_tokens"]["tokens"][0]
    assert any("Ġ" in p or "Ċ" in p for p in pieces)  # the sample does hold byte-level pieces
    assert f'"{task.words_text(pieces)}"' in caption and "Ġ" not in caption and "Ċ" not in caption


def test_a_swept_null_beside_integers_labels_runs_as_the_sweep_writes_them():
    """mla-vs-gqa sweeps `model.n_kv_heads: [2, null]`: the results table holds 2.0 and NaN, and the
    runs must still carry the labels the `expect:` entries resolve to (2, None), or no verdict finds
    its runs."""
    from workbench.report.sweep_points import Variants

    runs = pd.DataFrame({"model.n_kv_heads": [2, None, 2], "train.lr": [1.0, 1.0, 2.0]})
    assert runs["model.n_kv_heads"].dtype == float  # what pandas makes of it
    variants = Variants.of(["model.n_kv_heads", "train.lr"], runs, {"model.n_kv_heads": [2, None], "train.lr": [1.0, 2.0]})
    assert variants.labels == ["n_kv_heads=2, lr=1.0", "n_kv_heads=2, lr=2.0", "n_kv_heads=None, lr=1.0"]
    assert list(variants.label_runs(runs)) == ["n_kv_heads=2, lr=1.0", "n_kv_heads=None, lr=1.0", "n_kv_heads=2, lr=2.0"]
