"""The report of a scaling study: cost against sequence length, fitted log-log exponents,
the attention/projection crossover, decode latency and KV-cache bytes.

Rows are the store's measurements (one per variant x mode x length [x cache]); exponents and
crossovers come from workbench.cost.fit. Each figure names the instrument behind its numbers
(FLOP accounting, live tensor bytes or CUDA allocator), time figures show their quartiles,
axes are in readable units, and every measurement that ran out of memory or time is listed,
never dropped.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
import yaml
from scipy import stats as st

from workbench.cost import fit

from workbench.run import store
from workbench.model.attention import AttentionVariant
from workbench.report import merged_environment, reproduce_command, timing_caveat
from workbench.results import Status
from workbench.model.spec import parse_spec
from workbench.report import figures
from workbench.report.document import (
    Code,
    Figure,
    Item,
    Paragraph,
    Report,
    Section,
    Table,
    fmt,
    fmt_bytes,
    fmt_seconds,
)
from workbench.report.sweep_points import Variants, value_text

COORDINATES = ("scope", "mode", "length", "kv_cache")
# The header's Learned line: a cost study trains nothing, so there is no chance level to beat.
# Sections that show timings: each gets the shared-machine caveat line when it applies.
TIMED_SECTIONS = ("Fitted exponents", "Cost against length", "Decoding", "All measurements")
NOT_TRAINED = "Learned: no learned criterion applies: nothing is trained for quality here (this study measures cost)"


@dataclass(frozen=True)
class Cost:
    column: str
    kind: str  # key of UNITS
    axis: str  # axis label, the unit is appended
    word: str  # title word
    slug: str
    instrument: str  # column that labels how the figure was obtained
    spread: tuple[str, str] | None = None  # (low, high) columns drawn as a band


COSTS = (
    Cost("time_median_s", "seconds", "time per call (median)", "time", "time", "time_instrument",
         ("time_q25_s", "time_q75_s")),
    Cost("flops", "flops", "useful FLOPs per call", "useful FLOPs", "flops", "flops_source"),
    Cost("flops_executed", "flops", "executed FLOPs per call", "executed FLOPs", "flops_executed",
         "flops_executed_source"),
    Cost("peak_memory_bytes", "bytes", "peak memory", "peak memory", "memory", "peak_memory_instrument"),
    Cost("activation_bytes", "bytes", "saved activations", "activation memory", "activations",
         "activation_instrument"),
)
FLOP_WORDS = {
    "flops": "useful FLOPs: projections, FFN and the rest as counted, plus 4 h hd per (query, key) pair the "
             "pattern allows",
    "flops_executed": "executed FLOPs: what the kernels compute, masked scores and whole tiles included",
}
UNITS = {  # (divisor, name), smallest first
    "seconds": ((1e-6, "µs"), (1e-3, "ms"), (1.0, "s")),
    "bytes": ((1, "bytes"), (2**10, "KiB"), (2**20, "MiB"), (2**30, "GiB")),
    "flops": ((1, "FLOPs"), (1e3, "kFLOPs"), (1e6, "MFLOPs"), (1e9, "GFLOPs"), (1e12, "TFLOPs")),
}


def unit_of(values: pd.Series, kind: str) -> tuple[float, str]:
    """The largest unit of `kind` not above the median of the positive values."""
    positive = pd.to_numeric(values, errors="coerce")
    positive = positive[positive > 0]
    middle = float(positive.median()) if not positive.empty else 1.0
    fitting = [u for u in UNITS[kind] if u[0] <= middle]
    return fitting[-1] if fitting else UNITS[kind][0]


def in_unit(frame: pd.DataFrame, cost: Cost) -> tuple[pd.DataFrame, str]:
    """frame with the cost's columns divided by a readable unit, and the axis label."""
    scale, name = unit_of(frame[cost.column], cost.kind)
    columns = [cost.column, *(cost.spread or ())]
    scaled = frame.assign(**{c: pd.to_numeric(frame[c], errors="coerce") / scale for c in columns if c in frame})
    return scaled, f"{cost.axis} ({name})"


def time_with_quartiles(row: dict[str, Any]) -> str:
    median = fmt_seconds(row.get("time_median_s"))
    q25, q75 = row.get("time_q25_s"), row.get("time_q75_s")
    if median == "–" or q25 is None or q75 is None or pd.isna(q25) or pd.isna(q75):
        return median
    return f"{median} [{fmt_seconds(q25)}, {fmt_seconds(q75)}]"


def measurement_rows(runs: list[dict[str, Any]], keys: list[str]) -> pd.DataFrame:
    """Store runs (Store.runs()) -> one flat row per measurement: swept keys, coordinates,
    status, every figure with its label (strings kept: instrument names are data)."""
    rows = []
    for r in runs:
        row = {"run_id": r["run_id"], "index": r["index"], "status": r["status"], "error": r.get("error")}
        row.update({k: r["swept"].get(k) for k in keys})
        row.update({c: r["swept"].get(c) for c in COORDINATES})
        row.update(r["metrics"])
        row["peak_memory_bytes"] = r.get("peak_memory_bytes")
        row["peak_memory_instrument"] = r.get("peak_memory_instrument")
        rows.append(row)
    frame = pd.DataFrame(rows)
    return frame.sort_values("index").reset_index(drop=True) if not frame.empty else frame


def exponent_text(exponent: float, stderr: float, n_points: int) -> str:
    """'2.01 [1.95, 2.07]': the slope with its 95% t interval (n - 2 degrees of freedom)."""
    if n_points < 3:
        return f"{exponent:.2f} (2 points, no CI)"
    if math.isnan(stderr):  # scipy: a constant cost has no correlation to derive an error from
        return f"{exponent:.2f} (constant, no CI)"
    half = float(st.t.ppf(0.975, df=n_points - 2)) * stderr
    return f"{exponent:.2f} [{exponent - half:.2f}, {exponent + half:.2f}]"


class ScalingReport:
    def __init__(self, study, runs: list[dict[str, Any]], environment: dict[str, str], command: str, dest: Path):
        self.study, self.dest, self.environment, self.command = study, dest, environment, command
        self.records = runs
        self.keys = list(study.sweep.keys)
        self.rows = measurement_rows(runs, self.keys)
        swept = {k: study.sweep.values(k) for k in self.keys}
        self.variants = Variants.of(self.keys, self.rows, swept)
        self.rows["variant"] = self.variants.label_runs(self.rows)
        self.ok = self.rows[self.rows["status"] == Status.FINISHED].copy()
        palette = figures.variant_palette(self.variants.labels)
        self.palette = {v: palette[v] for v in self.variants.labels}
        self.exponents = fit.fit_exponents(self.ok, by=("variant", "mode", "kv_cache"),
                                           metrics=[c.column for c in COSTS] + ["kv_cache_bytes"])

    def figure(self, path: Path | None, caption: str, alt: str) -> Figure | None:
        return None if path is None else Figure(path.relative_to(self.dest).as_posix(), caption, alt)

    def instruments(self, part: pd.DataFrame, column: str) -> str:
        if column not in part:
            return ""
        values = sorted(set(part[column].dropna().astype(str)))
        return ", ".join(values)

    # ---- sections ----------------------------------------------------------------------------

    def setup(self) -> Section:
        s = self.study
        sc = s.scaling
        items: list[Item] = [
            Paragraph(f"Scope: {self.scope_text()}; modes: {', '.join(sc.modes)}; lengths: "
                      f"{', '.join(map(str, sc.lengths))}; batch size {sc.batch_size}; dtype {sc.dtype}; "
                      f"device {sc.device}; {sc.repeats} timed calls after {sc.warmup} warm-up per point, "
                      f"each point in {'a fresh process' if sc.isolate else 'this process'}."),
            Paragraph("Fixed model parts (everything else at its default):"),
            Code(yaml.safe_dump(s.model, sort_keys=True).strip() if s.model else "{} (all defaults)"),
        ]
        if self.keys:
            items.append(Paragraph("Swept: " + "; ".join(
                f"{k} over {', '.join(value_text(v) for v in s.sweep.values(k))}" for k in self.keys)))
        items.append(Paragraph(
            "Instruments. Time: wall clock per call (median, quartiles over the timed calls). FLOPs, two "
            "accountings computed the same way for every variant: " + FLOP_WORDS["flops"] + "; "
            + FLOP_WORDS["flops_executed"] + " (the CPU flash kernel by its tiles). Peak memory: on the CPU the "
            "peak of live tensor bytes allocated during the call (a TorchDispatchMode over storages; kernel "
            "scratch buffers excluded), on CUDA max_memory_allocated over the start; the process's peak-RSS "
            "growth stays in the CSV as process_peak_rss_delta_bytes, not a headline figure."))
        statuses = sorted(set(self.rows["status"]), key=lambda x: (x != Status.FINISHED, x))
        table_rows = []
        for variant in self.variants.labels:
            mine = self.rows[self.rows["variant"] == variant]
            table_rows.append([variant, *(str(int((mine["status"] == x).sum())) for x in statuses), str(len(mine))])
        items.append(Table(["variant", *statuses, "measurements"], table_rows, caption="Measurements by status",
                           numeric=[False] + [True] * (len(statuses) + 1)))
        items.append(Paragraph("Reproduce:"))
        items.append(Code(self.command))
        return Section("Setup", items)

    def scope_text(self) -> str:
        """What each mode measures: decode always runs the whole model, whatever `scope` says."""
        modes = self.study.scaling.modes
        others = [m for m in modes if m != "decode"]
        if not others:
            return "model (decode measures the whole model)"
        if len(others) < len(modes):
            return f"{self.study.scaling.scope} ({', '.join(others)}); the whole model (decode)"
        return self.study.scaling.scope

    def exponent_table(self) -> Section:
        if self.exponents.empty:
            return Section("Fitted exponents", [Paragraph("Too few finished measurements to fit an exponent.")])
        rows = []
        ex = self.exponents.copy()
        ex["order"] = ex["variant"].map({v: i for i, v in enumerate(self.variants.labels)})
        for r in ex.sort_values(["order", "mode", "kv_cache", "metric"]).to_dict("records"):
            cache = r.get("kv_cache")
            mode = r["mode"] + ("" if cache is None or pd.isna(cache) else f" ({'cache' if cache else 'no cache'})")
            rows.append([r["variant"], mode, r["metric"], exponent_text(r["exponent"], r["stderr"], r["n_points"]),
                         r["lengths"]])
        return Section("Fitted exponents", [
            Paragraph("Slope of log(cost) against log(n) by least squares over the largest lengths "
                      "(workbench.cost.fit), with a 95% t interval from its standard error: ~1 is linear, ~2 quadratic."),
            Table(["variant", "mode", "metric", "exponent [95% CI]", "lengths used"], rows,
                  numeric=[False, False, False, True, False])])

    def legend_exponents(self, mode: str, metric: str, cache: Any = None) -> dict[str, str]:
        ex = self.exponents
        if ex.empty:
            return {}
        part = ex[(ex["mode"] == mode) & (ex["metric"] == metric)]
        if cache is not None and "kv_cache" in part:
            part = part[part["kv_cache"] == cache]
        return {r["variant"]: f"n^{r['exponent']:.2f}" for r in part.to_dict("records")}

    def cost_figure(self, part: pd.DataFrame, cost: Cost, path: Path, *, title: str, caption: str, alt: str,
                    palette=None, exponents=None, xlabel: str = "sequence length n (tokens)") -> Figure | None:
        if cost.column not in part or part[cost.column].isna().all():
            return None
        scaled, ylabel = in_unit(part, cost)
        spread = cost.spread if cost.spread and all(c in part for c in cost.spread) else None
        drawn = figures.loglog(scaled, palette or self.palette, path, y=cost.column, ylabel=ylabel, title=title,
                               exponents=exponents, xlabel=xlabel, spread=spread)
        instrument = self.instruments(part, cost.instrument)
        band = " Band: quartiles of the timed calls." if spread else ""
        return self.figure(drawn, f"{caption} Instrument: {instrument or 'n/a'}.{band}", alt)

    def cost_figures(self) -> Section | None:
        items: list[Item] = []
        fig_dir = self.dest / "figures"
        for mode in [m for m in self.study.scaling.modes if m != "decode"]:
            part = self.ok[self.ok["mode"] == mode]
            for cost in COSTS:
                items.append(self.cost_figure(
                    part, cost, fig_dir / f"{cost.slug}_{mode}.png", title=f"{cost.word} against length ({mode})",
                    caption=f"{cost.word.capitalize()} per {mode} call against sequence length, log-log; legend: "
                            "fitted exponent.",
                    alt=f"{cost.word} against length, {mode}", exponents=self.legend_exponents(mode, cost.column)))
        items = [i for i in items if i is not None]
        return Section("Cost against length", items) if items else None

    def crossover(self) -> Section | None:
        """Per variant with a dense pattern (every or every earlier key): the measured crossover in
        both FLOP accountings, each beside its analytic formula (claim E2)."""
        needed = {"flops_attention", "flops_executed_attention", "flops_projections", "flops_ffn"}
        forward = self.ok[self.ok["mode"] == "forward"]
        if forward.empty or not needed <= set(forward.columns):
            return None
        items: list[Item] = []
        rows = []
        for variant in self.variants.labels:
            part = forward[forward["variant"] == variant]
            point = dict(zip(self.variants.keys, self.variants.points[self.variants.labels.index(variant)]))
            model = self.model_of(point)
            if part.empty or model is None or not dense_pattern(model):
                continue
            whole_matrix = bool((part["flops_executed_attention"]
                                 == 4 * part["n_heads"] * part["head_dim"] * part["batch_size"] * part["length"] ** 2).all())
            found = {}
            for accounting in ("useful", "executed"):
                try:
                    found[accounting] = measured = fit.measured_crossover(part, accounting)
                except ValueError as err:
                    rows.append([variant, accounting, "–", "–", str(err)])
                    continue
                if accounting == "useful" or whole_matrix:
                    analytic = fit.analytic_crossover(model, accounting)
                    formula = fit.crossover_formula(model, accounting)
                    analytic_text = f"{analytic:,.0f} ({analytic / model['d_model']:.3g} d)"
                else:
                    analytic_text, formula = "–", "tiled kernel: between the two formulas, depends on its tile sizes"
                rows.append([variant, accounting, f"{measured.length:,.0f} ({measured.method})", analytic_text, formula])
            long = pd.concat([
                part.assign(part_name="useful", value=part["flops_attention"]),
                part.assign(part_name="executed", value=part["flops_executed_attention"]),
                part.assign(part_name="rest", value=part["flops_projections"] + part["flops_ffn"]),
            ]).rename(columns={"part_name": "part"})
            scale, unit = unit_of(long["value"], "flops")
            long["value"] = long["value"] / scale
            useful = found.get("useful")
            path = figures.crossover(long, self.dest / "figures" / f"crossover_{len(items) + 1}.png", y="value",
                                     ylabel=f"FLOPs per forward call ({unit})",
                                     parts={"useful": "attention, useful (allowed pairs)",
                                            "executed": "attention, executed (kernel)",
                                            "rest": "projections + FFN"},
                                     measured=useful.length if useful else None,
                                     analytic=fit.analytic_crossover(model, "useful"))
            items.append(self.figure(path, f"{variant}: attention against projections + FFN (forward); vertical "
                                           "lines: measured and analytic crossover of the useful accounting.",
                                     f"crossover for {variant}"))
        if not rows:
            return None
        table = Table(["variant", "FLOP accounting", "measured crossover n", "analytic n*", "formula"], rows,
                      caption="Attention/projection crossover (claim E2), d = d_model",
                      numeric=[False, False, True, True, False])
        return Section("Attention/projection crossover", [
            Paragraph("Useful: attention counts the (query, key) pairs the pattern allows (causal: n (n + 1) / 2). "
                      "Executed: what the kernel computes (the naive kernel the whole n x n matrix, the fused CPU "
                      "kernel its tiles). Projections + FFN are the same in both."),
            table, *[i for i in items if i is not None]])

    def model_of(self, point: dict[str, str]) -> dict[str, Any] | None:
        for raw in self.study.sweep_points():
            if {k: value_text(v) for k, v in raw.items()} == point:
                return self.study.model_of(raw)
        return None

    def decode(self) -> Section | None:
        part = self.ok[self.ok["mode"] == "decode"]
        if part.empty:
            return None
        fig_dir = self.dest / "figures"
        items: list[Item] = []
        labelled = part.assign(variant=part["variant"] + part["kv_cache"].map(
            lambda c: " (KV cache)" if c else " (no cache)"))
        labels = sorted(set(labelled["variant"]))
        palette = {}
        for v in labels:  # the variant's colour; dashed-looking distinction by lightness
            base = v.rsplit(" (", 1)[0]
            colour = self.palette.get(base, (0.3, 0.3, 0.3))
            palette[v] = colour if v.endswith("(KV cache)") else tuple(0.55 * c + 0.45 for c in colour)
        per_token = {  # cost column -> (axis word, caption)
            "time_median_s": ("time per generated token", "Time to generate one token at a given context length, "
                                                        "with and without the KV cache (median of timed calls)."),
            "flops": ("useful FLOPs per generated token", "Useful FLOPs of one decoding step: with the cache the new "
                                                        "token's projections and its row of scores, without it the "
                                                        "whole context again (the LM head on the last position only)."),
            "peak_memory_bytes": ("peak memory per generated token", "Peak memory one decoding step allocates (the "
                                                                  "cache's existing bytes excluded)."),
        }
        for cost in [c for c in COSTS if c.column in per_token]:
            word, caption = per_token[cost.column]
            exps = {}
            for cache in (True, False):
                for variant, text in self.legend_exponents("decode", cost.column, cache).items():
                    exps[f"{variant} ({'KV cache' if cache else 'no cache'})"] = text
            items.append(self.cost_figure(
                labelled, Cost(cost.column, cost.kind, word, word, cost.slug, cost.instrument, cost.spread),
                fig_dir / f"decode_{cost.slug}.png", title=f"{word} against context length", caption=caption,
                alt=f"decode {word}", palette=palette, exponents=exps, xlabel="context length (tokens)"))
        cached = labelled[labelled["kv_cache"] == True]  # noqa: E712 - a column of booleans
        if "kv_cache_bytes" in cached and cached["kv_cache_bytes"].notna().any():
            cache_bytes = Cost("kv_cache_bytes", "bytes", "KV-cache size", "KV-cache bytes", "kv_cache_bytes",
                               "kv_cache_bytes_formula")
            scaled, ylabel = in_unit(cached, cache_bytes)
            path = figures.loglog(scaled, palette, fig_dir / "kv_cache_bytes.png", y="kv_cache_bytes",
                                  ylabel=ylabel, title="KV-cache bytes against context length",
                                  exponents={f"{v} (KV cache)": t for v, t in
                                             self.legend_exponents("decode", "kv_cache_bytes", True).items()},
                                  xlabel="context length (tokens)")
            items.append(self.figure(path, "Bytes the cache holds after the context, measured (each layer's "
                                           "formula beside it in results.csv, kv_cache_bytes_formula: attention 2 x K/V "
                                           "heads x head_dim x tokens x batch x bytes per element; a latent or "
                                           "recurrent mixer states its own).",
                                     "KV-cache bytes"))
            rows = []
            for r in cached.sort_values(["variant", "length"]).to_dict("records"):
                rows.append([r["variant"], f"{int(r['length']):,}", fmt_bytes(r["kv_cache_bytes"]),
                             time_with_quartiles(r)])
            items.append(Table(["variant", "context length", "KV-cache bytes", "time per token (median [q25, q75])"],
                               rows, numeric=[False, True, True, True]))
        return Section("Decoding", [i for i in items if i is not None])

    def failures(self) -> Section:
        failed = self.rows[self.rows["status"] != Status.FINISHED]
        if failed.empty:
            return Section("Failed measurements", [Paragraph("Every measurement finished.")])
        rows = [[r["variant"], str(r["mode"]), f"{int(r['length']):,}", str(r["status"]),
                 str(r.get("error") or "–").strip().splitlines()[0]] for r in failed.to_dict("records")]
        return Section("Failed measurements", [
            Paragraph("Measurements that ran out of memory or time are results too: the length where a variant "
                      "stops fitting is part of its cost."),
            Table(["variant", "mode", "length", "status", "message"], rows,
                  numeric=[False, False, True, False, False])])

    def measurements_table(self) -> Section:
        rows = []
        for r in self.rows.to_dict("records"):
            rows.append([r["variant"], str(r["mode"]) + ("" if r.get("kv_cache") is None or pd.isna(r.get("kv_cache"))
                                                         else f" cache={r['kv_cache']}"),
                         f"{int(r['length']):,}", str(r["status"]), time_with_quartiles(r),
                         fmt(r.get("flops")), fmt(r.get("flops_executed")), fmt_bytes(r.get("peak_memory_bytes"))])
        return Section("All measurements", [Table(
            ["variant", "mode", "length", "status", "time (median [q25, q75])", "FLOPs (useful)", "FLOPs (executed)",
             "peak memory"], rows, numeric=[False, False, True, False, True, True, True, True])])

    def build(self) -> Report:
        sections = [self.setup(), self.exponent_table()]
        for extra in (self.cost_figures(), self.crossover(), self.decode()):
            if extra is not None:
                sections.append(extra)
        sections += [self.failures(), self.measurements_table()]
        caveat = timing_caveat(self.records, overlap=False)  # a point's measurements are recorded together
        for section in sections if caveat else ():
            if section.title in TIMED_SECTIONS:
                section.items.insert(0, Paragraph(caveat))
        if self.study.notes.strip():
            sections.append(Section("Notes", [Paragraph(p.strip()) for p in self.study.notes.split("\n\n") if p.strip()]))
        sections.append(Section("Environment", [Table(["", "value"], [[k, v] for k, v in sorted(self.environment.items())])]))
        return Report(name=self.study.name, kind="scaling", question=self.study.description or "(no description)",
                      verdicts=[], sections=sections, learned=[NOT_TRAINED])

    def results_csv(self) -> pd.DataFrame:
        frame = self.rows.drop(columns=["variant"])
        frame.insert(0, "variant", self.rows["variant"])
        return frame


def dense_pattern(model: dict[str, Any]) -> bool:
    """True when the attention variant is one kernel on every layer that reads every key (causal:
    every earlier key): its `allowed` is the base class's, so the n^2 crossover formulas apply. A
    token mixer (no kernel pattern: differential, latent attention, Gated DeltaNet) or a per-layer
    pattern is not."""
    attention = parse_spec(model).attention
    return getattr(attention, "cls", None) is not None and getattr(attention.cls, "allowed", None) is AttentionVariant.allowed


def report_from_store(out_dir: Path, study, info: dict[str, Any], dest: Path) -> tuple[Report, pd.DataFrame]:
    runs = store.Store(out_dir, create=False).runs()
    builder = ScalingReport(study, runs, merged_environment([r["environment"] for r in runs]),
                            reproduce_command({**info, "name": study.name}, out_dir), dest)
    return builder.build(), builder.results_csv()
