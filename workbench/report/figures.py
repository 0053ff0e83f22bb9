"""The figures of a report: plain functions from tidy DataFrames to PNG files.

Every figure is drawn with the Agg backend (no display) and saved without a creation date or
software version, so regenerating a report gives byte-identical PNGs. They are saved with a
palette of 256 colours (a colormap has 256 entries), about a third of the bytes of full colour:
reports ship in the repository, figures and all. One palette, keyed by
variant label, is passed to every figure of a report: a variant keeps its colour throughout.
Bands are the same 95% t intervals over seeds as the tables (stats.mean_ci), not bootstraps.
"""

from __future__ import annotations

import functools
import logging
import math
from collections.abc import Callable, Mapping, Sequence
from functools import lru_cache
from pathlib import Path
from typing import ParamSpec, TypeVar

import matplotlib

matplotlib.use("Agg")  # before pyplot: reports are written headless

import matplotlib.pyplot as plt  # noqa: E402
import matplotlib.ticker  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import seaborn as sns  # noqa: E402
from matplotlib import font_manager  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from PIL import Image  # noqa: E402

from workbench.report.document import fmt_bytes  # noqa: E402
from workbench.stats.intervals import mean_ci  # noqa: E402

# A CJK font often ships one weight (500): matplotlib would log a warning for every text.
logging.getLogger("matplotlib.font_manager").addFilter(lambda r: "Failed to find font weight" not in r.getMessage())

P = ParamSpec("P")
R = TypeVar("R")
Palette = Mapping[str, tuple[float, float, float]]
DPI = 110


def styled(draw: Callable[P, R]) -> Callable[P, R]:
    """Draw under the report's style: DejaVu Sans with a CJK fallback font when one is
    installed (token labels such as 我 爱 猫), the same sizes in every figure."""

    @functools.wraps(draw)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        with plt.rc_context({"font.family": ["DejaVu Sans", *_fallback_fonts()], "font.size": 9,
                             "axes.titlesize": 10, "svg.hashsalt": "workbench"}):
            return draw(*args, **kwargs)

    return wrapper


# Okabe & Ito's palette (Color Universal Design, 2008), distinguishable under the common
# colour-vision deficiencies; black last (it reads as "reference"). Variants take colours in
# sweep order, so neighbours in a legend never share a hue.
OKABE_ITO = ("#0072B2", "#E69F00", "#009E73", "#D55E00", "#56B4E9", "#CC79A7", "#F0E442", "#000000")
def variant_palette(labels: Sequence[str]) -> dict[str, tuple[float, float, float]]:
    """A fixed colour per variant label, in the order given (colour-blind safe up to 8
    variants; up to 10 with seaborn's colour-blind palette; distinct hues past that)."""
    labels = list(dict.fromkeys(map(str, labels)))
    if len(labels) <= len(OKABE_ITO):
        colours = [matplotlib.colors.to_rgb(c) for c in OKABE_ITO[:len(labels)]]
    else:
        colours = sns.color_palette("colorblind" if len(labels) <= 10 else "husl", len(labels))
    return dict(zip(labels, colours))


Bounds = tuple[float, float]  # (lowest, highest) value a metric can take, as its task declares
UNBOUNDED: Bounds = (-math.inf, math.inf)


def t_band(values: pd.Series, bounds: Bounds = UNBOUNDED) -> tuple[float, float]:
    """seaborn errorbar callable: the 95% t interval over seeds (no band for one seed),
    clipped to the metric's possible range."""
    iv = mean_ci(values)
    lo, hi = (iv.mean, iv.mean) if math.isnan(iv.lo) else (iv.lo, iv.hi)
    return max(lo, bounds[0]), min(hi, bounds[1])


def band(bounds: Bounds) -> Callable[[pd.Series], tuple[float, float]]:
    """The seed band of a metric whose values lie within `bounds` (an accuracy band never
    passes 1, a symbol accuracy's never goes below 0)."""
    return functools.partial(t_band, bounds=bounds)


# Fewer seeds per variant get no t band: with 2 its half-width is 12.7 standard errors and it
# hides the curves; the seeds' thin lines around their mean show their spread as it is.
MIN_BAND_SEEDS = 5


def banded(data: pd.DataFrame) -> bool:  # (variant, seed, ...) rows: does every variant have the seeds?
    return not data.empty and int(data.groupby("variant")["seed"].nunique().min()) >= MIN_BAND_SEEDS


def spread_text(data: pd.DataFrame) -> str:
    """A caption's words for how a figure shows the spread over seeds (a band only when `banded`)."""
    if banded(data):
        return "each seed as a thin line; per variant the mean over seeds with a 95% t band, kept inside the metric's range"
    return (f"each seed as a thin line around its variant's mean (no t band below {MIN_BAND_SEEDS} seeds per variant: "
            "it would span most of the panel)")


def constant(values: pd.Series) -> bool:
    """Every value the same (exact_match 0 everywhere): a plot of it shows nothing."""
    return values.dropna().nunique() <= 1


def seed_lines(ax, data: pd.DataFrame, palette: Palette, x: str) -> None:
    """Each seed's own thin, faint line (a dot where it has one point), beside the mean."""
    for (variant, _), run in data.groupby(["variant", "seed"], sort=False):
        run = run.sort_values(x)
        ax.plot(run[x], run["value"], color=palette[variant], linewidth=0.7, alpha=0.35,
                marker="." if len(run) == 1 else None, zorder=1)


def byte_axis(axis) -> None:
    """A log-scaled axis of byte counts with ticks at powers of two, read as KiB/MiB/GiB."""
    axis.set_major_locator(matplotlib.ticker.LogLocator(base=2))
    axis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: fmt_bytes(v)))
    axis.set_minor_formatter(matplotlib.ticker.NullFormatter())


BINARY_UNITS = ((2**30, "GiB"), (2**20, "MiB"), (2**10, "KiB"), (1, "bytes"))


def byte_unit(largest: float) -> tuple[float, str]:
    """The binary unit in which `largest` bytes reads as 1 to 1023 of it."""
    return next((size, name) for size, name in BINARY_UNITS if largest >= size or size == 1)


def save(fig: Figure, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    # Drawn once into the canvas's own pixels (constrained layout already fits the labels), not
    # through savefig's PNG, which Pillow would only decode again: the same pixels, 0.4 s less
    # CPU per report of 16 figures.
    fig.set_dpi(DPI)
    fig.canvas.draw()
    image = Image.frombuffer("RGBA", fig.canvas.get_width_height(), fig.canvas.buffer_rgba(), "raw", "RGBA", 0, 1)
    plt.close(fig)
    # Pillow writes no metadata of its own (matplotlib's would name its version); no dithering,
    # so flat areas and lines keep one colour each. The fast octree palette and zlib's default
    # level, not median cut and `optimize`: a report's 16 figures quantized and written in 0.08 s
    # of CPU instead of 0.55 s, in 11% fewer bytes, each pixel on average 1.2 of 255 off its
    # rendered colour (median cut: 0.1; the largest error 35 against 71).
    image.convert("RGB").quantize(256, method=Image.Quantize.FASTOCTREE, dither=Image.Dither.NONE) \
        .save(path, format="PNG")
    return path


def new_axes(width: float = 6.4, height: float = 4.0):
    fig, ax = plt.subplots(figsize=(width, height), layout="constrained")
    ax.grid(True, which="major", alpha=0.3)
    return fig, ax


# ---------------------------------------------------------------- training studies


@styled
def learning_curves(curves: pd.DataFrame, palette: Palette, path: Path, *, panels: Sequence[str],
                    bounds: Mapping[str, Bounds] | None = None, xlabel: str = "training step",
                    per_seed: bool = False) -> Path | None:
    """curves: long rows (variant, seed, x, metric, value; x defaults to the step) -> one panel
    per metric in `panels` order: each seed's thin line, and per variant the mean with its 95%
    seed band (clipped to the panel's `bounds`; none below MIN_BAND_SEEDS seeds); with `per_seed`
    only a line per run (seeds whose
    x values differ, such as seconds, have no mean). A panel whose values are all equal is left out."""
    if "x" not in curves:
        curves = curves.assign(x=curves["step"])
    panels = [p for p in panels if (curves["metric"] == p).any() and not constant(curves[curves["metric"] == p]["value"])]
    if not panels:
        return None
    fig, axes = plt.subplots(1, len(panels), figsize=(4.6 * len(panels), 3.6), layout="constrained", squeeze=False)
    for ax, metric in zip(axes[0], panels):
        part = curves[curves["metric"] == metric]
        few_points = part["x"].nunique() <= 12
        if per_seed:
            sns.lineplot(data=part, x="x", y="value", hue="variant", units="seed", estimator=None,
                         hue_order=[v for v in palette if v in set(part["variant"])], palette=palette,
                         marker="o" if few_points else None, ax=ax)
        else:
            seed_lines(ax, part, palette, "x")
            sns.lineplot(data=part, x="x", y="value", hue="variant",
                         hue_order=[v for v in palette if v in set(part["variant"])], palette=palette,
                         errorbar=band((bounds or {}).get(metric, UNBOUNDED)) if banded(part) else None,
                         marker="o" if few_points else None, ax=ax)
        ax.set(xlabel=xlabel, ylabel=metric, title=metric)
        if "loss" in metric and (part["value"] > 0).all():
            ax.set_yscale("log")
            plain_tick_labels(ax.yaxis)
        ax.grid(True, alpha=0.3)
        ax.legend(title="variant" if per_seed else "variant (thin: seeds)", fontsize="small")
    return save(fig, path)


@styled
def quality_vs_length(by_length: pd.DataFrame, palette: Palette, path: Path, *, metric: str,
                      train_length: int | None = None, bounds: Bounds = UNBOUNDED) -> Path | None:
    """by_length: rows (variant, seed, length, value) for one metric evaluated at several
    lengths -> each seed's thin line and the mean with its seed band per variant (none when not `banded`); the training
    length is marked. None for fewer than two lengths, or when every value is the same."""
    if by_length["length"].nunique() < 2 or constant(by_length["value"]):
        return None
    fig, ax = new_axes()
    seed_lines(ax, by_length, palette, "length")
    sns.lineplot(data=by_length, x="length", y="value", hue="variant",
                 hue_order=[v for v in palette if v in set(by_length["variant"])], palette=palette,
                 errorbar=band(bounds) if banded(by_length) else None, marker="o", ax=ax)
    ax.set_xscale("log", base=2)
    lengths = sorted(by_length["length"].unique())
    ax.set_xticks(lengths, [str(int(n)) for n in lengths])
    ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    if train_length:
        ax.axvline(train_length, color="grey", linestyle="--", linewidth=1, label=f"training length ({train_length})")
    ax.set(xlabel="evaluation length (tokens, log scale)", ylabel=metric, title=f"{metric} against evaluation length")
    ax.legend(title="variant (thin: seeds)", fontsize="small")
    return save(fig, path)


# A cost axis is logarithmic only when the costs span at least this factor; a narrower range
# on a log axis fills it with a small difference (4% across the whole axis) and one tick.
LOG_COST_RANGE = 10.0


@styled
def quality_vs_cost(summary: pd.DataFrame, palette: Palette, path: Path, *, metric: str, cost: str,
                    cost_label: str, bounds: Bounds = UNBOUNDED, seeds: pd.DataFrame | None = None) -> Path | None:
    """summary: one row per variant with mean, ci_lo, ci_hi of the metric and the mean `cost`;
    seeds: (variant, value, cost) per finished run -> each seed's dot and each variant's mean
    with its interval (clipped to `bounds`). The cost axis starts at 0 unless the costs span a
    factor of LOG_COST_RANGE (then it is logarithmic, with plain tick labels)."""
    data = summary.dropna(subset=["mean", cost])
    data = data[data[cost] > 0]
    if data.empty:
        return None
    points = seeds.dropna(subset=["value", cost]) if seeds is not None else pd.DataFrame(columns=["variant", "value", cost])
    costs = pd.concat([data[cost], points[cost]])
    logarithmic = costs.max() >= LOG_COST_RANGE * costs.min()
    scale, unit = byte_unit(costs.max()) if cost.endswith("_bytes") and not logarithmic else (1.0, "")
    fig, ax = new_axes()
    low, high = bounds
    for variant, part in points.groupby("variant", sort=False):
        ax.scatter(part[cost] / scale, part["value"], s=14, alpha=0.45, color=palette[variant], linewidths=0, zorder=2)
    for row in data.itertuples(index=False):
        row = row._asdict()
        lo = row["mean"] - max(row["ci_lo"], low) if not math.isnan(row["ci_lo"]) else 0.0
        hi = min(row["ci_hi"], high) - row["mean"] if not math.isnan(row["ci_hi"]) else 0.0
        ax.errorbar([row[cost] / scale], [row["mean"]], yerr=[[lo], [hi]], fmt="o", capsize=4, markersize=7,
                    color=palette[row["variant"]], label=row["variant"], zorder=3)
    name = cost_label.split(" (")[0]
    if logarithmic:
        ax.set_xscale("log")
        if cost.endswith("_bytes"):
            byte_axis(ax.xaxis)
        else:
            plain_tick_labels(ax.xaxis)
        xlabel = f"{name} (log scale)" if cost.endswith("_bytes") else f"{cost_label}, log scale"
    else:
        ax.set_xlim(0, costs.max() / scale * 1.08)
        ax.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(6))
        xlabel = f"{name} ({unit})" if unit else cost_label
    ax.set(xlabel=xlabel, ylabel=f"{metric} (dots: seeds; mean, 95% CI)", title=f"{metric} against {name}")
    ax.legend(title="variant", fontsize="small")
    return save(fig, path)


@styled
def loss_vs_compute(points: pd.DataFrame, curves: Mapping[str, Callable[[np.ndarray], np.ndarray]], palette: Palette,
                    path: Path, *, metric: str) -> Path | None:
    """points: one row per run (variant, compute, loss) -> the runs as dots and each variant's
    fitted law (`curves[variant](compute)`) as a line across the measured range, log compute axis."""
    data = points.dropna(subset=["compute", "loss"])
    if data.empty:
        return None
    fig, ax = new_axes()
    grid = np.geomspace(data["compute"].min(), data["compute"].max(), 200)
    for variant, part in data.groupby("variant", sort=False):
        color = palette.get(variant)
        ax.scatter(part["compute"], part["loss"], color=color, s=18, alpha=0.7)
        if variant in curves:
            ax.plot(grid, curves[variant](grid), color=color, label=variant)
    ax.set_xscale("log")
    ax.set(xlabel="training FLOPs (counted, log scale)", ylabel=metric, title=f"{metric} against training compute")
    ax.legend(title="variant (fitted law)", fontsize="small")
    return save(fig, path)


# ---------------------------------------------------------------- scaling studies


@styled
def loglog(rows: pd.DataFrame, palette: Palette, path: Path, *, y: str, ylabel: str, title: str,
           exponents: Mapping[str, str] | None = None, x: str = "length", xlabel: str = "sequence length n (tokens)",
           reference: Mapping[str, pd.DataFrame] | None = None, spread: tuple[str, str] | None = None,
           spread_label: str = "quartiles") -> Path | None:
    """rows: (variant, x, y) measurements -> log-log lines per variant; `exponents` maps a
    variant to its fitted-exponent text for the legend; `reference` adds dashed lines;
    `spread` names (low, high) columns drawn as a band around each line (e.g. quartiles). Values
    are drawn as given: callers convert bytes and seconds to a readable unit first."""
    data = rows.dropna(subset=[y])
    data = data[data[y] > 0]
    if data[x].nunique() < 2:
        return None
    fig, ax = new_axes()
    columns = [y, *(spread or ())]
    for variant in [v for v in palette if v in set(data["variant"])]:
        part = data[data["variant"] == variant].groupby(x, as_index=False)[columns].median().sort_values(x)
        label = variant if not exponents or variant not in exponents else f"{variant}: {exponents[variant]}"
        ax.plot(part[x], part[y], marker="o", color=palette[variant], label=label)
        if spread:
            ax.fill_between(part[x], part[spread[0]], part[spread[1]], color=palette[variant], alpha=0.25, linewidth=0)
    for label, ref in (reference or {}).items():
        ax.plot(ref[x], ref[y], linestyle="--", color="grey", label=label)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    plain_tick_labels(ax)
    band = f"; band: {spread_label}" if spread else ""
    ax.set(xlabel=f"{xlabel}, log scale", ylabel=f"{ylabel}, log scale{band}", title=title)
    ax.legend(fontsize="small")
    return save(fig, path)


def plain_number(value: float) -> str:
    """1024 -> '1,024', 0.25 -> '0.25': tick labels a reader need not decode."""
    if value >= 1 and float(value).is_integer():
        return f"{value:,.0f}"
    return f"{value:,.6g}" if value >= 1e-4 else f"{value:.0e}"


class PlainLogFormatter(matplotlib.ticker.Formatter):
    """Labels the ticks the default log formatter would label, as plain numbers instead of
    powers (2^10, 10^-3)."""

    def __init__(self, inner: matplotlib.ticker.Formatter):
        self.inner = inner

    def set_axis(self, axis) -> None:
        super().set_axis(axis)
        self.inner.set_axis(axis)

    def set_locs(self, locs) -> None:
        super().set_locs(locs)
        self.inner.set_locs(locs)

    def __call__(self, x, pos=None) -> str:
        return plain_number(x) if self.inner(x, pos) else ""


def plain_tick_labels(*axes) -> None:
    """Plain numbers on log-scaled axes (an Axes means both of its axes)."""
    for axis in axes:
        for one in (axis.xaxis, axis.yaxis) if hasattr(axis, "xaxis") else (axis,):
            one.set_major_formatter(PlainLogFormatter(one.get_major_formatter()))
            one.set_minor_formatter(PlainLogFormatter(one.get_minor_formatter()))


@styled
def crossover(rows: pd.DataFrame, path: Path, *, y: str, ylabel: str, parts: Mapping[str, str],
              measured: float | None, analytic: float | None) -> Path | None:
    """rows: (part, length, y) for the attention and projection parts of one layer -> both on
    log-log axes with the measured and the analytic crossover length marked."""
    data = rows.dropna(subset=[y])
    data = data[data[y] > 0]
    if data.empty:
        return None
    fig, ax = new_axes()
    colours = dict(zip(parts, sns.color_palette("dark", len(parts))))
    for part, label in parts.items():
        sub = data[data["part"] == part].groupby("length", as_index=False)[y].median().sort_values("length")
        ax.plot(sub["length"], sub[y], marker="o", color=colours[part], label=label)
    if measured is not None and math.isfinite(measured):
        ax.axvline(measured, color="black", linestyle="-", linewidth=1, label=f"measured crossover n = {measured:,.0f}")
    if analytic is not None and math.isfinite(analytic):
        ax.axvline(analytic, color="grey", linestyle="--", linewidth=1, label=f"analytic crossover n = {analytic:,.0f}")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    plain_tick_labels(ax)
    ax.set(xlabel="sequence length n (tokens), log scale", ylabel=f"{ylabel}, log scale",
           title="attention against projections, per layer")
    ax.legend(fontsize="small")
    return save(fig, path)


# ---------------------------------------------------------------- what the model does


# Font families (and file names) that cover Chinese, e.g. Debian's fonts-wqy-zenhei or
# fonts-noto-cjk; the first installed one is used as a fallback after DejaVu Sans.
CJK_FONTS = ("Noto Sans CJK", "Noto Serif CJK", "WenQuanYi", "Source Han Sans", "Droid Sans Fallback", "AR PL")
CJK_FILES = ("notosanscjk", "notoserifcjk", "wqy", "sourcehansans", "droidsansfallback", "uming", "ukai")


@lru_cache(maxsize=1)
def _fallback_fonts() -> tuple[str, ...]:
    """Installed font families that cover CJK. Matplotlib's font cache predates fonts
    installed after it was built, so system font files are also searched and registered."""
    def known() -> list[str]:
        return sorted({f.name for f in font_manager.fontManager.ttflist if f.name.startswith(CJK_FONTS)})

    if not known():
        for path in sorted(font_manager.findSystemFonts()):
            if any(tag in Path(path).name.lower().replace("-", "").replace("_", "") for tag in CJK_FILES):
                try:
                    font_manager.fontManager.addfont(path)
                except (OSError, RuntimeError, ValueError):  # unreadable or a format FreeType rejects
                    continue
    return tuple(known()[:1])


@lru_cache(maxsize=None)
def _renderable(ch: str) -> bool:
    """Whether some installed font the figures use has a glyph for `ch`."""
    for family in ("DejaVu Sans", *_fallback_fonts()):
        path = font_manager.findfont(font_manager.FontProperties(family=family), fallback_to_default=False)
        if ord(ch) in matplotlib.ft2font.FT2Font(path).get_charmap():
            return True
    return False


def printable(text: str, fallback: str) -> str:
    """`text` when the installed fonts can draw it, else `fallback` (for titles and labels)."""
    return text if all(_renderable(ch) for ch in text) else fallback


def tick_labels(tokens: Sequence[str]) -> tuple[list[str], bool]:
    """Tokens as tick labels; those with glyphs no installed font has become `#i` (their text
    is then listed next to the figure). Returns the labels and whether any was replaced."""
    labels, replaced = [], False
    for i, token in enumerate(tokens):
        if all(_renderable(ch) for ch in token):
            labels.append(token)
        else:
            labels.append(f"#{i}")
            replaced = True
    return labels, replaced


@styled
def heatmaps(panels: Sequence[tuple[str, np.ndarray]], path: Path, *, x_tokens: Sequence[str], y_tokens: Sequence[str],
             xlabel: str, ylabel: str, title: str, cmap: str = "viridis", vmin: float | None = 0.0,
             vmax: float | None = 1.0, colorbar_label: str = "attention weight") -> Path:
    """A row of heatmaps with token tick labels (one per head or layer) sharing token axes.

    Drawn with `imshow`, not `sns.heatmap`: seaborn draws the whole figure after each panel to
    check whether tick labels overlap, so a figure of n panels was drawn n + 1 times; the labels
    here are set, and rotated, explicitly."""
    n = len(panels)
    cols = min(n, 4)
    rows = math.ceil(n / cols)
    longest = max(len(x_tokens), len(y_tokens))
    size = min(4.2, max(2.6, 0.38 * longest + 1.2))  # one readable cell per token, up to a point
    fig, axes = plt.subplots(rows, cols, figsize=(size * cols + 1.0, size * rows), layout="constrained", squeeze=False)
    for i, (ax, (name, matrix)) in enumerate(zip(axes.flat, panels)):
        ax.imshow(matrix, cmap=cmap, vmin=vmin, vmax=vmax, interpolation="nearest")  # square cells, row 0 on top
        _token_ticks(ax.set_xticks, x_tokens, rotation=90)
        _token_ticks(ax.set_yticks, y_tokens, rotation=0)
        # Every panel has the same tokens: they are named once per row (first column) and per
        # column (the lowest panel in it), as shared axes are; every label also costs layout time.
        if i % cols:
            ax.tick_params(labelleft=False)
        else:
            ax.set_ylabel(ylabel)
        if i + cols < n:
            ax.tick_params(labelbottom=False)
        else:
            ax.set_xlabel(xlabel)
        ax.spines[:].set_visible(False)
        ax.set_title(name, fontsize="small")
    for ax in list(axes.flat)[n:]:
        ax.set_visible(False)
    if vmin is None or vmax is None:  # each panel has its own scale: each gets its own colorbar
        for ax in list(axes.flat)[:n]:
            fig.colorbar(ax.images[0], ax=ax, label=colorbar_label, shrink=0.8)
    else:
        fig.colorbar(axes.flat[0].images[0], ax=axes.ravel().tolist(), label=colorbar_label, shrink=0.8)
    fig.suptitle(title)
    return save(fig, path)


def _token_ticks(set_ticks, tokens: Sequence[str], *, rotation: float) -> None:
    """Every token as a tick label up to 24 of them; beyond that every (n // 8)-th position."""
    if len(tokens) <= 24:
        set_ticks(range(len(tokens)), tick_labels(tokens)[0], rotation=rotation)
    else:
        every = range(0, len(tokens), max(1, len(tokens) // 8))
        set_ticks(every, [str(i) for i in every], rotation=rotation)


@styled
def attention_row(weights: np.ndarray, path: Path, *, query: str, key_tokens: Sequence[str], title: str) -> Path:
    """One query token's attention over the keys, one bar group per head: e.g. where 它 looks."""
    heads = weights.shape[0]
    labels, _ = tick_labels(key_tokens)
    frame = pd.DataFrame(
        [{"head": f"head {h}", "key": k, "weight": float(weights[h, k])} for h in range(heads) for k in range(len(key_tokens))]
    )
    fig, ax = new_axes(width=max(6.4, 0.45 * len(key_tokens) + 2), height=3.6)
    sns.barplot(data=frame, x="key", y="weight", hue="head", ax=ax, palette="dark")
    ax.set_xticks(range(len(key_tokens)), labels)
    ax.set(xlabel="key token", ylabel=f"attention weight of {printable(repr(query), 'the query')}",
           title=title, ylim=(0, 1))
    ax.legend(fontsize="small", ncols=min(heads, 4))
    return save(fig, path)


@styled
def matrix_heatmap(matrix: np.ndarray, path: Path, *, xlabel: str, ylabel: str, title: str, colorbar_label: str,
                   cmap: str = "RdBu_r", center: float | None = 0.0) -> Path:
    """A plain numeric heatmap (position encodings, score biases) without token labels."""
    fig, ax = new_axes(width=6.4, height=4.4)
    sns.heatmap(matrix, ax=ax, cmap=cmap, center=center, cbar_kws={"label": colorbar_label},
                xticklabels=max(1, matrix.shape[1] // 8), yticklabels=max(1, matrix.shape[0] // 8))
    ax.set(xlabel=xlabel, ylabel=ylabel, title=title)
    return save(fig, path)

