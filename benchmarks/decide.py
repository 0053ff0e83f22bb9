"""What a verdict costs to reach: seeds and CPU minutes, today's rule beside the earlier one, on the
same stored per-seed values (`python -m benchmarks --only decide`, or `python -m benchmarks.decide`).

Replays. Three studies were trained with 12 fixed seeds, and their results tables are kept as CSV
(benchmarks/results/decide-*.csv): the quickstart (studies/quickstart.yaml, 4 position schemes)
and CPU-sized language models (benchmarks/decide/lm.yaml at 300 steps, whose groups do not learn,
and lm-learns.yaml at 2,000). Each is replayed as an adaptive study
(`seeds: {first: 3, max: 12}`) through the runner's own add-seeds loop (`replay`): after every
round the loop asks which groups want more seeds and reveals their next stored runs, as training
them would. Seeds are revealed in a random order (a permutation of the 12 stored seeds, the same
for both groups of a seed, so pairs stay pairs); for each of `ORDERS` orders the two rules run in
turn on the same order. Per verdict: how often each rule decides within 12 seeds, the median seeds
per group at its decision, and the median CPU minutes its two groups' revealed runs spent (the
runs' own cpu_time_s, which load on a shared machine does not inflate).

Moderated variances (Smyth 2004, limma's empirical Bayes), measured and not adopted: shrinking
each comparison's variance of the paired differences towards the study's pooled one gives more
degrees of freedom at 3 seeds, but a study has a handful of comparisons, too few to estimate the
prior; `moderation_check` shows the false-decision rate that follows.
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import yaml
from rich.console import Console
from rich.table import Table
from scipy import optimize, special

from benchmarks import RESULTS_DIR
from workbench.errors import WorkbenchError
from workbench.recipes.train.gates import Gates
from workbench.recipes.train.runs import TrainRuns
from workbench.recipes.train.verdicts import Verdicts, seeds_wanted
from workbench.stats.sequential import (BEFORE_MIN_SEEDS, EARLIER_LOOKS, LOOKS, WITHOUT_FUTILITY, LookRule,
                                       grow_seeds, sequential_verdicts)
from workbench.stats.rule import Verdict
from workbench.recipes.train.study import TrainStudy
from workbench.study.keys import label
from workbench.recipes.train.sweep import point_key

ROOT = Path(__file__).resolve().parent.parent
CASES = {  # name -> (study file, its stored results)
    "quickstart": (ROOT / "studies" / "quickstart.yaml", RESULTS_DIR / "decide-quickstart.csv"),
    "lm": (ROOT / "benchmarks" / "decide" / "lm.yaml", RESULTS_DIR / "decide-lm.csv"),
    "lm-learns": (ROOT / "benchmarks" / "decide" / "lm-learns.yaml", RESULTS_DIR / "decide-lm-learns.csv"),
}
ORDERS, QUICK_ORDERS = 200, 10
FIRST, MOST = 3, 12
RULES = {"today": LOOKS, "2026-12-04": BEFORE_MIN_SEEDS, "without futility": WITHOUT_FUTILITY, "earlier": EARLIER_LOOKS}


def adaptive(path: Path, first: int = FIRST, most: int = MOST) -> TrainStudy:
    """The study file's study with `seeds: {first, max}` in place of its list."""
    data = yaml.safe_load(path.read_text(encoding="utf-8"))
    return TrainStudy.model_validate({**data, "seeds": {"first": first, "max": most}})


def replay(study: TrainStudy, runs: pd.DataFrame, rule: LookRule = LOOKS) -> tuple[list[Verdict], pd.DataFrame]:
    """The verdicts an adaptive study reaches when `runs`, every run it could train (drawn or trained
    in advance, seeds 0 .. max - 1), are revealed to it seed by seed through the runner's add-seeds
    loop (`grow_seeds`, asking `seeds_wanted` after each round as the runner does, under `rule`), and
    the runs it revealed."""
    plan, swept = study.seed_plan, list(study.sweep.keys)
    looks = rule.looks(plan.first, plan.max)
    point_of = [point_key({k: label(v) for k, v in row.items()}, swept) for row in runs[swept].to_dict("records")]
    revealed = dict.fromkeys(point_of, plan.first)
    seeds = runs["seed"].to_numpy()

    def stored() -> pd.DataFrame:  # what load_results would return after this round
        return runs[seeds < np.array([revealed[p] for p in point_of])]

    def comparisons():
        train_runs = TrainRuns(study, stored())
        return Verdicts(train_runs, Gates(train_runs)).comparisons()[0]

    grow_seeds(lambda: seeds_wanted(study, stored(), rule=rule), lambda counts, grown: revealed.update(grown),
               plan.first)
    return sequential_verdicts(comparisons(), looks, plan=False, rule=rule, seeds=study.every_seed), stored()


def reordered(runs: pd.DataFrame, order: Sequence[int]) -> pd.DataFrame:
    """`runs` with seed `order[i]` renamed i: the seeds revealed in that order, pairs kept."""
    rename = {old: new for new, old in enumerate(order)}
    return runs.assign(seed=runs["seed"].map(rename)).sort_values(["index"]).reset_index(drop=True)


def cost(verdict: Verdict, revealed: pd.DataFrame, keys: Sequence[str]) -> float:
    """CPU minutes the verdict's two groups spent up to its look (all they revealed, undecided)."""
    from workbench.report.sweep_points import Variants

    labels = Variants.of(keys, revealed).label_runs(revealed)
    mine = revealed[labels.isin([verdict.better, verdict.than])]
    if verdict.outcome.decides:
        mine = mine[mine["seed"] < verdict.seeds]
    return float(mine["cpu_time_s"].sum()) / 60


def outcome_under(rule_name: str, verdict: Verdict) -> str:
    """The verdict's outcome as `rule_name` words it. The earlier rule's gate ended the test: a
    comparison whose data show that neither group learned read "not tested" whatever its difference
    (there it ended at the first look that showed it, which may come before this replay's look);
    today's rule keeps the tested outcome and qualifies it."""
    if verdict.tests_claim:
        return str(verdict.outcome)
    return "not tested" if rule_name == "earlier" else f"{verdict.outcome} (neither group learned)"


def decided_under(rule_name: str, verdict: Verdict) -> bool:
    return verdict.outcome.decides and (verdict.tests_claim or rule_name != "earlier")


def replays(name: str, orders: int, rng: np.random.Generator) -> dict[str, Any]:
    """Each rule on the same `orders` random orders of the stored seeds: per verdict, the share
    decided, the median seeds to decide and the median CPU minutes."""
    path, table = CASES[name]
    study = adaptive(path)
    runs = pd.read_csv(table)
    stored_seeds = sorted(runs["seed"].unique())
    if len(stored_seeds) < MOST:
        raise SystemExit(f"{table}: {len(stored_seeds)} seeds stored; the replay needs {MOST}")
    found: dict[str, list[list[tuple[Verdict, float]]]] = {r: [] for r in RULES}
    for _ in range(orders):
        order = rng.permutation(stored_seeds)[:MOST]
        shuffled = reordered(runs[runs["seed"].isin(order)], order)
        for rule_name, rule in RULES.items():  # alternating, on the same order
            verdicts, revealed = replay(study, shuffled, rule)
            found[rule_name].append([(v, cost(v, revealed, study.sweep.keys)) for v in verdicts])
    out = {}
    for rule_name, studies in found.items():
        entries = []
        for k in range(len(studies[0])):
            outcomes = [s[k][0] for s in studies]
            decides = [decided_under(rule_name, v) for v in outcomes]
            entries.append({
                "statement": outcomes[0].statement,
                "decided": sum(decides) / len(outcomes),
                "tests_claim": sum(v.tests_claim for v in outcomes) / len(outcomes),
                "outcomes": pd.Series([outcome_under(rule_name, v) for v in outcomes]).value_counts().to_dict(),
                "median_seeds": float(np.median([v.seeds if d else math.inf for v, d in zip(outcomes, decides)])),
                "median_cpu_min": float(np.median([c for _, c in (s[k] for s in studies)])),
            })
        out[rule_name] = entries
    return out


def moderated_t(differences: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """limma's moderated t of each row's mean (Smyth 2004): each row's variance shrunk towards a
    scaled inverse chi-square prior whose degrees of freedom d0 and scale are fitted to all rows by
    the method of moments (limma's fitFDist). Returns (t, degrees of freedom)."""
    n = differences.shape[1]
    d = n - 1
    s2 = differences.var(axis=1, ddof=1)
    e = np.log(s2) - special.digamma(d / 2) + np.log(d / 2)
    excess = e.var(ddof=1) - special.polygamma(1, d / 2)
    if excess <= 0:  # variances no more spread than sampling alone: full pooling
        d0, s02 = math.inf, float(np.exp(e.mean()))
        posterior = np.full_like(s2, s02)
    else:
        half = optimize.brentq(lambda x: special.polygamma(1, x) - excess, 1e-8, 1e8)
        d0 = 2 * half
        s02 = float(np.exp(e.mean() + special.digamma(d0 / 2) - np.log(d0 / 2)))
        posterior = (d0 * s02 + d * s2) / (d0 + d)
    t = differences.mean(axis=1) / np.sqrt(posterior / n)
    return t, np.full_like(t, d + d0 if math.isfinite(d0) else 1e6)


def moderation_check(rng: np.random.Generator, studies: int = 20000, alpha: float = 0.01) -> list[dict[str, Any]]:
    """False decisions at a nominal `alpha` of 4 null comparisons of 3 paired seeds each, with
    the plain paired t (each comparison's own 2 degrees of freedom) and with limma's moderated t:
    equal variances, and one comparison whose arm is 3x noisier (its differences' SD sqrt(5) times)."""
    rows = []
    for case, sds in (("equal variances", [1.0, 1.0, 1.0, 1.0]), ("one arm 3x noisier", [math.sqrt(5), 1, 1, 1])):
        plain, moderated = np.zeros(4), np.zeros(4)
        for _ in range(studies):
            x = rng.normal(0.0, 1.0, (4, 3)) * np.array(sds)[:, None]
            t = x.mean(axis=1) / np.sqrt(x.var(axis=1, ddof=1) / 3)
            plain += 2 * special.stdtr(2, -np.abs(t)) < alpha
            tm, df = moderated_t(x)
            moderated += 2 * special.stdtr(df, -np.abs(tm)) < alpha
        rows.append({"case": case, "nominal": alpha, "plain_t": (plain / studies).round(4).tolist(),
                     "moderated_t": (moderated / studies).round(4).tolist()})
    return rows


def section(console: Console, quick: bool = False) -> dict[str, Any]:
    rng = np.random.default_rng(2026)
    results: dict[str, Any] = {"first": FIRST, "max": MOST, "rules": {k: r.name for k, r in RULES.items()},
                               "looks": {k: r.looks(FIRST, MOST) for k, r in RULES.items()}}
    for name, (path, table) in CASES.items():
        if not table.exists():
            console.print(f"[yellow]{name} skipped: {table} is not there (train {path} with its 12 seeds; "
                          "benchmarks/README.md says how)")
            continue
        found = replays(name, QUICK_ORDERS if quick else ORDERS, rng)
        results[name] = found
        table = Table(title=f"{name}: seeds to a decision over {QUICK_ORDERS if quick else ORDERS} orders of the stored "
                            f"seeds (adaptive, first {FIRST}, max {MOST})")
        for col in ("verdict", "rule", "decided", "tests the claim", "median seeds", "median CPU min", "outcomes"):
            table.add_column(col)
        for k, entry in enumerate(found["today"]):
            for rule_name in RULES:
                e = found[rule_name][k]
                table.add_row(e["statement"] if rule_name == "today" else "", rule_name, f"{e['decided']:.0%}",
                              f"{e['tests_claim']:.0%}", f"{e['median_seeds']:g}", f"{e['median_cpu_min']:.1f}",
                              ", ".join(f"{o} {n}" for o, n in e["outcomes"].items()))
        console.print(table)
    results["moderation"] = moderation_check(rng, 2000 if quick else 20000)
    table = Table(title="Moderated variances (limma, Smyth 2004) vs the plain paired t: 4 null comparisons, 3 seeds")
    for col in ("case", "nominal", "plain t, per comparison", "moderated t, per comparison"):
        table.add_column(col)
    for row in results["moderation"]:
        table.add_row(row["case"], f"{row['nominal']:g}", " ".join(f"{x:.2%}" for x in row["plain_t"]),
                      " ".join(f"{x:.2%}" for x in row["moderated_t"]))
    console.print(table)
    return results


def replayed_issue(source: Path, out: Path, rule: LookRule = LOOKS, study_path: Path | None = None,
                   partial: bool = False) -> tuple[list[str], list[str], dict[str, tuple[int, int]]]:
    """Re-issue the adaptive study stored in `source` (a store, e.g. reports/NAME/data) under `rule`
    without training: its final runs are revealed to the runner's add-seeds loop seed by seed (the
    tuning runs as they are), as `workbench run` would train them, and `out` receives a copy of the
    store holding only the runs the loop asked for (with their run folders). A run of a seed is the
    same run whichever rule asks for it (training is deterministic given its config and seed on one
    machine), so `out` is what a fresh issue under `rule` would store, at the CPU time each run spent
    when it ran; `workbench report OUT` then reports it. `study_path`: issue under that study file
    as it now reads (its expectations, notes: what may change without changing a run), recorded in
    OUT as `workbench run` records it; refused when it defines other runs than the store's. A rule
    that asks for seeds the store does not hold is refused, unless `partial`: then OUT keeps what the
    store has of those groups, and its report says that the rule asks for more. Returns (run ids
    kept, run ids dropped, point -> (seeds asked, seeds stored) where the store fell short)."""
    from workbench.recipes.train.tuning import choose
    from workbench.report import study_of
    from workbench.run.runner import check_study
    from workbench.run.store import Store, copy_store, load_results, run_dir
    from workbench.study import load_study

    if out.exists():
        raise SystemExit(f"{out} exists: give a new folder")
    store = Store(source, create=False)
    study_file = load_study(study_path) if study_path is not None else None
    if study_file is not None and study_file.study_hash != store.study_record().get("hash"):
        raise SystemExit(f"{study_path} defines other runs than the study stored in {source}: a replay re-issues "
                         "the same runs (the study's expectations and notes may change, not its runs)")
    study = study_file.study if study_file is not None else study_of(store.study_record())
    plan = getattr(study, "seed_plan", None)
    if plan is None:
        raise SystemExit(f"{source}: not an adaptive study (seeds: {{first, max}}): nothing to replay")
    runs, rows = load_results(source), store.runs()
    tunings = choose(study, rows)
    final = runs["stage"] == "final"
    keys = list(study.sweep.keys)
    swept = {r["run_id"]: r["swept"] for r in rows}  # labels as stored (a frame reads null as NaN)
    point_of = np.array([point_key({k: swept[run_id].get(k) for k in keys}, keys) for run_id in runs["run_id"]])
    order = runs["seed"].to_numpy() - plan.start  # the n-th seed of the plan: its look
    revealed = dict.fromkeys(point_of[final.to_numpy()], plan.first)

    def stored() -> pd.DataFrame:  # what load_results would return after this round
        shown = np.array([not f or o < revealed[p] for f, o, p in zip(final, order, point_of)])
        return runs[shown]

    short: dict[str, tuple[int, int]] = {}

    def reveal(counts: dict[str, int], grown: dict[str, int]) -> None:
        for point, n in grown.items():
            have = int(((point_of == point) & final.to_numpy() & (order < n)).sum())
            if have < n and not partial:
                raise SystemExit(f"{source}: the rule asks for {n} seeds of {point}; the store holds {have} "
                                 "(a replay reveals stored runs only; --partial keeps what it holds)")
            if have < n:
                short[point] = (n, have)
        revealed.update(grown)

    grow_seeds(lambda: seeds_wanted(study, stored(), tunings, rule), reveal, plan.first)
    kept = stored()["run_id"].tolist()
    dropped = sorted(set(runs["run_id"]) - set(kept))
    folders = {run_id: run_dir(source, run_id) for run_id in kept}  # refuses a folder holding a link
    out.mkdir(parents=True)
    copy_store(source, out)  # its rows into a fresh store: nothing of a received file's schema travels
    if study_file is not None:
        check_study(Store(out), study_file)  # the study file as it now reads, recorded as `workbench run` does
    with Store(out).connect() as conn:
        conn.executemany("DELETE FROM runs WHERE run_id = ?", [(r,) for r in dropped])
        conn.executemany("DELETE FROM curves WHERE run_id = ?", [(r,) for r in dropped])
    for run_id, folder in folders.items():  # the weights a report's pictures load, where the store shipped them
        if folder.is_dir():
            shutil.copytree(folder, run_dir(out, run_id))
    return kept, dropped, short


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.decide", description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help=f"{QUICK_ORDERS} orders instead of {ORDERS}")
    parser.add_argument("--out", type=Path, default=RESULTS_DIR / "decide.json", help="JSON output")
    parser.add_argument("--reissue", nargs=2, type=Path, metavar=("STORE", "OUT"),
                        help="re-issue the adaptive study stored in STORE under today's rule, training nothing: "
                             "OUT (a new folder) receives the runs it asks for (replayed_issue)")
    parser.add_argument("--study", type=Path, help="with --reissue: issue under this study file as it now reads "
                                                   "(its runs must be the store's)")
    parser.add_argument("--partial", action="store_true", help="with --reissue: where the rule asks for seeds the "
                                                               "store does not hold, keep what it holds (the report "
                                                               "says the rule asks for more) instead of refusing")
    args = parser.parse_args(argv)
    console = Console(width=150)
    if args.reissue:
        source, out = args.reissue
        try:
            kept, dropped, short = replayed_issue(source, out, study_path=args.study, partial=args.partial)
        except WorkbenchError as err:  # a damaged or foreign store: one line, nothing written
            raise SystemExit(f"error: {err}") from None
        console.print(f"{out}: {len(kept)} runs of {len(kept) + len(dropped)} kept, {len(dropped)} the rule no longer "
                      f"asks for dropped; report it with `workbench report {out} --out reports --with-data`")
        if short:
            console.print("short of what the rule asks (`workbench run` on the study trains them): "
                          + "; ".join(f"{point} {have} of {asked} seeds" for point, (asked, have) in short.items()))
        return 0
    results = section(console, args.quick)
    args.out.write_text(json.dumps(results, indent=1, default=str))
    console.print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
