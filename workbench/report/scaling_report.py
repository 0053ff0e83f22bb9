"""The report of a scaling study: cost against sequence length, fitted log-log exponents,
the attention/projection crossover, decode latency and KV-cache bytes.

Rows are the store's measurements (one per variant x mode x length [x cache]); exponents and
crossovers come from workbench.fit. Each figure names the instrument behind its numbers
(FLOP counter or analytic, peak RSS or CUDA allocator), and every measurement that ran out
of memory or time is listed, never dropped.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pandas as pd
import yaml
from scipy import stats as st

from workbench import fit
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
from workbench.report.variants import Variants, short_key, value_text

COORDINATES = ("scope", "mode", "length", "kv_cache")
FINISHED = "finished"

# (metric column, axis label with unit, title word, slug)
COSTS = (
    ("time_median_s", "time per call (s, median)", "time", "time"),
    ("flops", "FLOPs per call", "FLOPs", "flops"),
    ("peak_memory_bytes", "peak memory (bytes)", "peak memory", "memory"),
    ("activation_bytes", "saved activations (bytes)", "activation memory", "activations"),
)


def measurement_rows(runs: list[dict[str, Any]], keys: list[str]) -> pd.DataFrame:
    """Store runs (Store.runs()) -> one flat row per measurement: swept keys, coordinates,
    status, every figure with its label (strings kept: instrument names are data)."""
    rows = []
    for r in runs:
        row = {"run_id": r["run_id"], "position": r["position"], "status": r["status"], "error": r.get("error")}
        row.update({k: r["swept"].get(k) for k in keys})
        row.update({c: r["swept"].get(c) for c in COORDINATES})
        row.update(r["metrics"])
        row["peak_memory_bytes"] = r.get("peak_memory_bytes")
        row["peak_memory_instrument"] = r.get("peak_memory_instrument")
        rows.append(row)
    frame = pd.DataFrame(rows)
    return frame.sort_values("position").reset_index(drop=True) if not frame.empty else frame


def exponent_text(exponent: float, stderr: float, n_points: int) -> str:
    """'2.01 [1.95, 2.07]': the slope with its 95% t interval (n - 2 degrees of freedom)."""
    if math.isnan(stderr) or n_points < 3:
        return f"{exponent:.2f} (2 points, no CI)"
    half = float(st.t.ppf(0.975, df=n_points - 2)) * stderr
    return f"{exponent:.2f} [{exponent - half:.2f}, {exponent + half:.2f}]"


class ScalingReport:
    def __init__(self, study, runs: list[dict[str, Any]], environment: dict[str, str], command: str, dest: Path):
        self.study, self.dest, self.environment, self.command = study, dest, environment, command
        self.keys = list(study.sweep.keys)
        self.rows = measurement_rows(runs, self.keys)
        swept = {k: study.sweep.values(k) for k in self.keys}
        self.variants = Variants.of(self.keys, self.rows, swept)
        self.rows["variant"] = self.variants.label_runs(self.rows)
        self.ok = self.rows[self.rows["status"] == FINISHED].copy()
        self.ok["status"] = "ok"  # workbench.fit counts rows with the measurer's own "ok"
        palette = figures.variant_palette(self.variants.labels)
        self.palette = {v: palette[v] for v in self.variants.labels}
        self.exponents = fit.fit_exponents(self.ok, by=("variant", "mode", "kv_cache"),
                                           metrics=[c for c, *_ in COSTS] + ["kv_cache_bytes"])

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
            Paragraph(f"Scope: {sc.scope}; modes: {', '.join(sc.modes)}; lengths: "
                      f"{', '.join(map(str, sc.lengths))}; batch size {sc.batch_size}; dtype {sc.dtype}; "
                      f"device {sc.device}; {sc.repeats} timed calls after {sc.warmup} warm-up per point, "
                      f"each point in {'a fresh process' if sc.isolate else 'this process'}."),
            Paragraph("Fixed model parts (everything else at its default):"),
            Code(yaml.safe_dump(s.model, sort_keys=True).strip() if s.model else "{} (all defaults)"),
        ]
        if self.keys:
            items.append(Paragraph("Swept: " + "; ".join(
                f"{k} over {', '.join(value_text(v) for v in s.sweep.values(k))}" for k in self.keys)))
        statuses = sorted(set(self.rows["status"]), key=lambda x: (x != FINISHED, x))
        table_rows = []
        for variant in self.variants.labels:
            mine = self.rows[self.rows["variant"] == variant]
            table_rows.append([variant, *(str(int((mine["status"] == x).sum())) for x in statuses), str(len(mine))])
        items.append(Table(["variant", *statuses, "measurements"], table_rows, caption="Measurements by status",
                           numeric=[False] + [True] * (len(statuses) + 1)))
        items.append(Paragraph("Reproduce:"))
        items.append(Code(self.command))
        return Section("Setup", items)

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
                      "(workbench.fit), with a 95% t interval from its standard error: ~1 is linear, ~2 quadratic."),
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

    def cost_figures(self) -> Section:
        items: list[Item] = []
        fig_dir = self.dest / "figures"
        for mode in [m for m in self.study.scaling.modes if m != "decode"]:
            part = self.ok[self.ok["mode"] == mode]
            for column, ylabel, word, slug in COSTS:
                if column not in part or part[column].isna().all():
                    continue
                label_col = {"time_median_s": "time_instrument", "flops": "flops_source",
                             "peak_memory_bytes": "peak_memory_instrument",
                             "activation_bytes": "activation_instrument"}[column]
                instrument = self.instruments(part, label_col)
                path = figures.loglog(part, self.palette, fig_dir / f"{slug}_{mode}.png", y=column, ylabel=ylabel,
                                      title=f"{word} against length ({mode})",
                                      exponents=self.legend_exponents(mode, column))
                items.append(self.figure(path, f"{word.capitalize()} per {mode} call against sequence length, "
                                               f"log-log; legend: fitted exponent. Instrument: {instrument or 'n/a'}.",
                                         f"{word} against length, {mode}"))
        return Section("Cost against length", [i for i in items if i is not None])

    def crossover(self) -> Section | None:
        """Per variant whose attention FLOPs the counter sees: measured vs analytic crossover."""
        needed = {"flops_counted_attention", "flops_counted_projections", "flops_counted_ffn"}
        forward = self.ok[self.ok["mode"] == "forward"]
        if forward.empty or not needed <= set(forward.columns):
            return None
        items: list[Item] = []
        rows = []
        for variant in self.variants.labels:
            part = forward[forward["variant"] == variant]
            if part.empty or (part["flops_counted_attention"].fillna(0) <= 0).any():
                continue
            point = dict(zip(self.variants.keys, self.variants.points[self.variants.labels.index(variant)]))
            model = self.model_of(point)
            try:
                measured = fit.measured_crossover(part)
            except ValueError as err:
                rows.append([variant, "–", "–", str(err)])
                continue
            analytic = fit.analytic_crossover(model) if model is not None else math.nan
            rows.append([variant, f"{measured.length:,.0f} ({measured.method})", f"{analytic:,.0f}",
                         f"d_model={model['d_model']}" if model else ""])
            long = pd.concat([
                part.assign(part_name="attention", value=part["flops_counted_attention"]),
                part.assign(part_name="rest", value=part["flops_counted_projections"] + part["flops_counted_ffn"]),
            ]).rename(columns={"part_name": "part"})
            path = figures.crossover(long, self.dest / "figures" / f"crossover_{len(rows)}.png", y="value",
                                     ylabel="FLOPs per forward call (counted)",
                                     parts={"attention": "attention (scores and weighted sum)",
                                            "rest": "projections + FFN"},
                                     measured=measured.length, analytic=analytic)
            items.append(self.figure(path, f"{variant}: attention against projections + FFN (FLOP counter, "
                                           "forward); vertical lines: measured and analytic crossover.",
                                     f"crossover for {variant}"))
        if not rows:
            return None
        table = Table(["variant", "measured crossover n", "analytic n* (fit.analytic_crossover)", "model"], rows,
                      caption="Attention/projection crossover (claim E2)", numeric=[False, True, True, False])
        return Section("Attention/projection crossover", [table, *[i for i in items if i is not None]])

    def model_of(self, point: dict[str, str]) -> dict[str, Any] | None:
        for raw in self.study.sweep_points():
            if {k: value_text(v) for k, v in raw.items()} == point:
                return self.study.model_of(raw)
        return None

    @property
    def legend_title(self) -> str | None:
        """With one swept key a variant is labelled by its bare value ("1"): name the key."""
        keys = self.variants.keys
        return short_key(keys[0]) if len(keys) == 1 else None

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
        exps = {}
        for cache in (True, False):
            for variant, text in self.legend_exponents("decode", "time_median_s", cache).items():
                exps[f"{variant} ({'KV cache' if cache else 'no cache'})"] = text
        path = figures.loglog(labelled, palette, fig_dir / "decode_latency.png", y="time_median_s",
                              ylabel="time per generated token (s)", title="decode latency against context length",
                              exponents=exps, xlabel="context length (tokens)", legend_title=self.legend_title)
        items.append(self.figure(path, "Time to generate one token at a given context length, with and without the "
                                       "KV cache (median of timed calls).", "decode latency"))
        cached = labelled[labelled["kv_cache"] == True]  # noqa: E712 - a column of booleans
        if "kv_cache_bytes" in cached and cached["kv_cache_bytes"].notna().any():
            path = figures.loglog(cached, palette, fig_dir / "kv_cache_bytes.png", y="kv_cache_bytes",
                                  ylabel="KV-cache size (bytes)", title="KV-cache bytes against context length",
                                  exponents={f"{v} (KV cache)": t for v, t in
                                             self.legend_exponents("decode", "kv_cache_bytes", True).items()},
                                  xlabel="context length (tokens)", legend_title=self.legend_title)
            items.append(self.figure(path, "Bytes the KV cache holds (2 x layers x K/V heads x head_dim x tokens x "
                                           "batch x bytes per element).", "KV-cache bytes"))
            rows = []
            for r in cached.sort_values(["variant", "length"]).to_dict("records"):
                rows.append([r["variant"], f"{int(r['length']):,}", fmt_bytes(r["kv_cache_bytes"]),
                             fmt_seconds(r["time_median_s"])])
            items.append(Table(["variant", "context length", "KV-cache bytes", "time per token"], rows,
                               numeric=[False, True, True, True]))
        return Section("Decoding", [i for i in items if i is not None])

    def failures(self) -> Section:
        failed = self.rows[self.rows["status"] != FINISHED]
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
                         f"{int(r['length']):,}", str(r["status"]), fmt_seconds(r.get("time_median_s")),
                         fmt(r.get("flops")), fmt_bytes(r.get("peak_memory_bytes"))])
        return Section("All measurements", [Table(
            ["variant", "mode", "length", "status", "time (median)", "FLOPs", "peak memory"], rows,
            numeric=[False, False, True, False, True, True, True])])

    def build(self) -> Report:
        sections = [self.setup(), self.exponent_table(), self.cost_figures()]
        for extra in (self.crossover(), self.decode()):
            if extra is not None:
                sections.append(extra)
        sections += [self.failures(), self.measurements_table()]
        if self.study.notes.strip():
            sections.append(Section("Notes", [Paragraph(p.strip()) for p in self.study.notes.split("\n\n") if p.strip()]))
        sections.append(Section("Environment", [Table(["", "value"], [[k, v] for k, v in sorted(self.environment.items())])]))
        return Report(name=self.study.name, kind="scaling", question=self.study.description or "(no description)",
                      verdicts=[], sections=sections)

    def results_csv(self) -> pd.DataFrame:
        frame = self.rows.drop(columns=["variant"])
        frame.insert(0, "variant", self.rows["variant"])
        return frame


def scaling_report_from_store(out_dir: Path, study, info: dict[str, Any], dest: Path) -> tuple[Report, pd.DataFrame]:
    from workbench import store
    from workbench.report import merged_environment, reproduce_command

    runs = store.Store(out_dir, create=False).runs()
    builder = ScalingReport(study, runs, merged_environment([r["environment"] for r in runs]),
                            reproduce_command({**info, "name": study.name}, out_dir), dest)
    return builder.build(), builder.results_csv()
