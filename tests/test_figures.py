"""Figure details users read: per-panel colorbars, colour-blind-safe colours, bands inside a
metric's range, memory in KiB/MiB/GiB, and legends that name the swept key."""

from __future__ import annotations

import itertools

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
    assert figures.band("accuracy@64")(near_one)[1] == 1.0  # ... the drawn band does not
    assert figures.band("loss")(pd.Series([0.001, 0.2, 0.01]))[0] == 0.0
    assert figures.band("some_plugin_metric")(near_one) == figures.t_band(near_one)


def test_memory_axes_read_in_binary_units(drawn, tmp_path):
    summary = pd.DataFrame({"variant": ["a", "b"], "mean": [0.5, 0.9], "ci_lo": [0.4, 0.8], "ci_hi": [0.6, 1.1],
                            "peak_memory_bytes": [300 * 2**20, 1.5 * 2**30]})
    figures.quality_vs_cost(summary, figures.variant_palette(["a", "b"]), tmp_path / "c.png", metric="accuracy@8",
                            cost="peak_memory_bytes", cost_label="peak memory (bytes)")
    ax = drawn[0].axes[0]
    ticks = [t.get_text() for t in ax.get_xticklabels() if t.get_text()]
    assert ticks and all(t.endswith(("KiB", "MiB", "GiB")) for t in ticks), ticks
    assert "bytes" not in ax.get_xlabel() and "e+" not in "".join(ticks)
    top = max(line.get_ydata().max() for line in ax.lines)
    assert top <= 1.0  # the interval of b (0.8..1.1) is drawn up to 1.0


def test_a_bare_swept_value_gets_its_key_as_the_legend_title(drawn, tmp_path):
    # the scaling report converts bytes to a unit first (scaling_report.in_unit): 1 and 2 MiB
    rows = pd.DataFrame({"variant": ["1 (KV cache)"] * 2, "length": [64, 128], "kv_cache_bytes": [1.0, 2.0]})
    figures.loglog(rows, {"1 (KV cache)": (0, 0, 0)}, tmp_path / "d.png", y="kv_cache_bytes",
                   ylabel="KV-cache size (MiB)", title="t", legend_title="n_kv_heads")
    ax = drawn[0].axes[0]
    assert ax.get_legend().get_title().get_text() == "n_kv_heads"
    ticks = [t.get_text() for t in ax.get_yticklabels() if t.get_text()]
    assert ticks and not any("^" in t or "e+" in t for t in ticks), ticks  # plain numbers on a log axis
