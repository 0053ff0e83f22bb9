"""Reports of a tiny training study and a tiny scaling study, written from a results store.

The stores are filled through the store's own API (`Store.record` with `RunResult`s) with
constructed figures, so the expected intervals, verdicts and exponents are known exactly;
final weights are real models of the runs' specs (untrained: the pictures code is the same).
The HTML is checked by parsing, and in headless Chromium when it is installed.
"""

from __future__ import annotations

import html as html_lib
import json
import re
import shutil
import struct
import subprocess
import tempfile
from html.parser import HTMLParser
from pathlib import Path

import pytest
import torch
from conftest import HANG_GUARD_S, run_within_cpu

from workbench import build_model
from workbench.report import screenshot as screenshot_tool
from workbench.api import write_report
from workbench.report.document import fmt_signed_interval
from workbench.run.store import Store, run_dir
from workbench.study import load_study
from workbench.study.keys import canonical_json
from workbench.results import FINAL_WEIGHTS, RunConfig, RunResult, git_commit, short_commit
from workbench.recipes.train.sweep import expand
from workbench.model.weights import save_final_weights

TRAIN_STUDY_QUESTION = "Does ALiBi extrapolate? <script>alert('x')</script> & more"
TRAIN_STUDY = """
name: positions
description: "Does ALiBi extrapolate? <script>alert('x')</script> & more"
notes: |
  Constructed results for the report tests.
task: {name: translate, train_length: 6, eval_lengths: [6, 10], n_eval: 8}
model: {family: encoder_decoder, d_model: 16, n_heads: 2, n_layers: 1}
train: {steps: 3, batch_size: 4}
seeds: [0, 1, 2, 3, 4]
sweep: {model.position: [sinusoidal, alibi, rope]}
baseline: sinusoidal
expect:
  - {metric: accuracy@10, better: alibi, than: sinusoidal}
  - {metric: accuracy@10, better: sinusoidal, than: alibi}
  - {metric: accuracy@10, better: rope, than: sinusoidal}
"""
# accuracy@10 per variant and seed; rope seed 2 runs out of memory. Five seeds: a verdict needs 4 per
# group (seeds 3 and 4 at the group's mean keep sinusoidal and alibi's means and correlation).
ACCURACY = {"sinusoidal": [0.50, 0.52, 0.51, 0.51, 0.51], "alibi": [0.90, 0.91, 0.92, 0.91, 0.91],
            "rope": [0.10, 0.90, None, 0.10, 0.90]}

SCALING_STUDY = """
name: attention-cost
kind: scaling
description: How does the cost of attention grow with n?
model: {family: decoder, vocab_size: 32, d_model: 16, n_heads: 2, n_layers: 1, position: none}
sweep: {model.attention: [naive, full]}
scaling: {lengths: [64, 128, 256, 512], modes: [forward, decode], scope: layer, isolate: false, device: cpu}
"""


def save_study(store: Store, study_file) -> None:
    study = study_file.study
    store.save_study({"name": study.name, "kind": study.kind, "hash": study_file.study_hash,
                      "run_defining": canonical_json(study.run_defining()),
                      "study": json.dumps(study.model_dump(mode="json"), default=str),
                      "yaml": study_file.text, "source": str(study_file.path), "profile": ""})


def png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", f"{path} is not a PNG"
    return struct.unpack(">II", data[16:24])


class Page(HTMLParser):
    """Tables (as lists of cell texts), images, headings, script elements and all text."""

    def __init__(self):
        super().__init__()
        self.tables, self.images, self.headings, self.scripts, self.text = [], [], [], 0, []
        self._cell, self._tag = None, []

    def handle_starttag(self, tag, attrs):
        self._tag.append(tag)
        if tag == "table":
            self.tables.append([])
        elif tag == "tr":
            self.tables[-1].append([])
        elif tag in ("td", "th"):
            self._cell = []
        elif tag == "img":
            self.images.append(dict(attrs))
        elif tag == "script":
            self.scripts += 1

    def handle_endtag(self, tag):
        if tag in ("td", "th"):
            self.tables[-1][-1].append("".join(self._cell).strip())
            self._cell = None
        if self._tag:
            self._tag.pop()

    def handle_data(self, data):
        self.text.append(data)
        if self._cell is not None:
            self._cell.append(data)
        if self._tag and self._tag[-1] in ("h1", "h2"):
            self.headings.append(data.strip())


def parse(html: str) -> Page:
    page = Page()
    page.feed(html)
    return page


TRAINED_AT = {0: "0123456789abcdef0123", 1: "0123456789abcdef0123", 2: "fedcba9876543210fedc+dirty",
              3: "0123456789abcdef0123", 4: "0123456789abcdef0123"}


@pytest.fixture(scope="module")
def train_report(tmp_path_factory):
    root = tmp_path_factory.mktemp("train")
    (root / "study.yaml").write_text(TRAIN_STUDY)
    study_file = load_study(root / "study.yaml")
    out = root / "out"
    store = Store(out)
    save_study(store, study_file)
    for run in expand(study_file):
        position = run.swept["model.position"]
        acc = ACCURACY[position][run.seed]
        finished = acc is not None
        metrics = {"accuracy@6": acc + 0.05, "accuracy@10": acc, "loss@6": 1 - acc, "loss@10": 1.5 - acc,
                   "bleu@6": 50 * acc, "bleu@10": 40 * acc, "exact_match@6": acc / 2,
                   "exact_match@10": acc / 3} if finished else {}
        curves = [(s, "train", "loss", 3.0 / s + 0.1 * run.seed) for s in (1, 2, 3)]
        curves += [(3, "eval", "loss@6", 1 - acc)] if finished else []
        store.record(run, RunResult(
            run_id=run.run_id, status="finished" if finished else "oom", steps_done=3 if finished else 1,
            metrics=metrics, curves=curves, n_params=5000, wall_time_s=10.0 + run.seed, cpu_time_s=15.0 + run.seed,
            error=None if finished else "CUDA out of memory. Tried to allocate <2 GiB>",
            tokens=1200, tokens_per_s=120.0, peak_memory_bytes=(5 + run.seed) * 2**20,
            peak_memory_instrument="process_peak_rss",
            environment={"torch": torch.__version__, "device": "cpu", "git_commit": TRAINED_AT[run.seed]}))
        if finished:
            folder = run_dir(out, run.run_id)
            folder.mkdir(parents=True)
            torch.manual_seed(run.seed)
            model = build_model(run.config["model"])
            save_final_weights(model, run.config, 3, folder / FINAL_WEIGHTS)
    index = write_report(out, root / "reports")
    return out, root, index


def test_training_report_files_and_verdicts(train_report):
    out, root, index = train_report
    assert index == root / "reports" / "positions" / "index.html"
    html = index.read_text()
    page = parse(html)
    text = " ".join(page.text)

    # Study text is escaped: it shows as text and never becomes an element.
    assert page.scripts == 0 and "<script>alert('x')</script> & more" in text
    assert "&lt;script&gt;" in html

    # Verdicts at the top, computed by the rule.
    assert page.headings[:3] == ["positions", "Verdicts", page.headings[2]]
    verdicts = re.findall(r'class="outcome [\w-]+">([^<]+)</span>\s*([^<]+)', html)
    assert [(label.strip()[:60], statement.strip()) for label, statement in verdicts] == [
        ("holds", "position=alibi is better than position=sinusoidal on accuracy@10"),
        ("does not hold", "position=sinusoidal is better than position=alibi on accuracy@10"),
        ("inconclusive (the interval of the difference contains 0; 4 s",
         "position=rope is better than position=sinusoidal on accuracy@10"),
    ]
    # an inconclusive verdict says what its seeds can detect and what the observed difference would need
    # with its sign, against the claim, and what the seeds would be for
    assert ("4 seeds detect ±0.778 with 80% power; to find the observed difference -0.01 (against the claim) "
            "with 80% power would take more than 1000 seeds") in html

    # Leaderboard for the expectation metric: sorted best first, intervals, baseline differences.
    board = next(t for t in page.tables if t[0][1] == "accuracy@10 mean [95% CI]")
    # means 0.91, 0.51, 0.50
    assert [row[0] for row in board[1:]] == ["position=alibi", "position=sinusoidal", "position=rope"]
    alibi = board[1]
    assert alibi[1] == "0.91 [0.901, 0.919]" and alibi[2] == "5/5"
    assert alibi[3].startswith("+0.4 [")
    assert board[2][3] == "baseline"
    assert board[3][1] == "0.5 [0, 1]" and board[3][2] == "4/5"  # seeds far apart: t interval cut to [0, 1]
    assert "(process_peak_rss)" in alibi[6]

    # Run counts by status, and the failed run with its message and step.
    status = next(t for t in page.tables if t[0][:3] == ["variant", "finished", "diverged"])
    assert status[-1] == ["total", "14", "0", "1", "0", "15"]
    failed = next(t for t in page.tables if t[0] == ["variant", "seed", "status", "step", "message"])
    assert failed[1] == ["position=rope", "2", "oom", "1", "CUDA out of memory. Tried to allocate <2 GiB>"]

    # The command that reproduces it, the notes and the environment.
    assert f"workbench run {root / 'study.yaml'} --out {out}" in text
    assert "Constructed results for the report tests." in text
    assert "torch" in [row[0] for t in page.tables for row in t]

    # What the study cost: wall and CPU time (seeds 0-4 spent 15-19 CPU seconds, three positions), as in the index.
    run_time = html_lib.unescape(re.search(r"<h2[^>]*>Run time</h2>\s*<p>([^<]+)", html).group(1))
    assert re.match(r"[\d.]+ s wall, 4.25 min CPU, 15 runs\. Wall: from the first run's start", run_time), run_time
    assert json.loads((index.parent / "summary.json").read_text())["run_cpu_s"] == 255
    # Which source built the report (this checkout) and which trained the runs (two commits here).
    source = re.search(r"<p>(Source: [^<]+)</p>", html).group(1)
    assert source == (f"Source: report built at commit {short_commit(git_commit())}; runs trained at commit "
                      "0123456789ab (12 runs), fedcba987654+dirty (3 runs)."), source


def test_training_report_figures(train_report):
    _, _, index = train_report
    folder = index.parent
    page = parse(index.read_text())
    sources = [img["src"] for img in page.images]
    for src in sources:
        assert not src.startswith(("/", "http")), src  # relative: opens from disk, no network
        width, height = png_size(folder / src)
        assert width > 200 and height > 150
    names = {Path(s).name for s in sources}
    assert {"learning_curves.png", "accuracy_vs_length.png", "time_vs_quality.png", "memory_vs_quality.png"} <= names
    # Cross-attention on 我 爱 猫, the 它 rows of both pronoun sentences, and a position picture per scheme.
    assert {f"attention_position_{v}.png" for v in ACCURACY} <= names
    assert {f"focus_position_{v}_{i}.png" for v in ACCURACY for i in (0, 1)} <= names
    assert {f"position_{v}.png" for v in ACCURACY} <= names
    assert "我 爱 猫" in " ".join(page.text)

    md = (folder / "report.md").read_text()
    assert "![" in md and "](figures/learning_curves.png)" in md
    assert "| position=alibi | 0.91 \\[0.901, 0.919\\] | 5/5 |" in md
    assert "<script>" not in md and "&lt;script&gt;" in md
    csv = (folder / "results.csv").read_text().splitlines()
    assert csv[0].startswith("variant,run_id,index,seed,model.position,status,")
    assert len(csv) == 1 + 15


def test_regenerating_gives_the_same_report(train_report):
    out, root, index = train_report
    again = write_report(out, root / "again")
    first, second = index.parent, again.parent
    files = sorted(p.relative_to(first) for p in first.rglob("*") if p.is_file())
    assert files == sorted(p.relative_to(second) for p in second.rglob("*") if p.is_file())
    for name in files:
        assert (first / name).read_bytes() == (second / name).read_bytes(), name


@pytest.mark.skipif(shutil.which("chromium") is None, reason="Debian chromium is not installed")
def test_report_renders_in_headless_chromium(train_report):
    _, _, index = train_report
    with tempfile.TemporaryDirectory() as profile:
        dom = run_within_cpu(
            ["chromium", "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
             "--disable-component-update", "--disable-sync", "--no-first-run", f"--user-data-dir={profile}",
             "--dump-dom", index.resolve().as_uri()],
            CHROMIUM_CPU_S, text=True, check=True).stdout
    page = parse(dom)
    assert page.scripts == 0
    assert "Verdicts" in page.headings and "Leaderboard" in page.headings
    assert any(row[0] == "position=alibi" for t in page.tables for row in t)
    assert len(page.images) >= 10


# A headless page load or screenshot takes a few CPU seconds, its browser processes together.
CHROMIUM_CPU_S = 120
CHROMIUM = ["chromium", "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
            "--disable-component-update", "--disable-sync", "--no-first-run", "--hide-scrollbars"]
# Appended to a copy of a report: where every table ends against the box that holds it and the
# page, measured by the browser after layout, written into the page for --dump-dom to return.
MEASURE_TABLES = """<script>
const view = document.documentElement.clientWidth;
const tables = [...document.querySelectorAll("table")].map(t => {
  const box = t.parentElement, rect = box.getBoundingClientRect();
  return {columns: t.rows[0].cells.length, table: t.scrollWidth, box: box.clientWidth, boxRight: rect.right,
          scrolls: ["auto", "scroll"].includes(getComputedStyle(box).overflowX)};
});
const out = document.createElement("pre");
out.id = "measured";
out.textContent = JSON.stringify({view, page: document.documentElement.scrollWidth, tables});
document.body.append(out);
</script></body>"""
WIDE_STUDY = """
name: wide
task: {name: copy, train_length: 6, eval_lengths: [6, 12, 24, 48], n_eval: 8}
model: {family: decoder, d_model: 16, n_heads: 2, n_layers: 1}
train: {steps: 3, batch_size: 4}
seeds: [0, 1, 2]
sweep: {model.attention: [full, {name: sliding_window, window: 4}]}
"""


@pytest.mark.skipif(shutil.which("chromium") is None, reason="Debian chromium is not installed")
def test_every_column_of_a_two_variant_report_shows_at_1280_px(tmp_path):
    (tmp_path / "study.yaml").write_text(WIDE_STUDY)
    study_file = load_study(tmp_path / "study.yaml")
    store = Store(tmp_path / "out")
    save_study(store, study_file)
    for run in expand(study_file):
        acc = 0.5 + 0.1 * run.seed + (0.2 if run.swept["model.attention"] == "full" else 0.0)
        metrics = {f"{m}@{n}": acc / k for n, k in ((6, 1), (12, 2), (24, 3), (48, 4))
                   for m in ("accuracy", "exact_match", "symbol_accuracy", "loss")}
        store.record(run, RunResult(run_id=run.run_id, status="finished", steps_done=3, metrics=metrics,
                                    curves=[(3, "train", "loss", 1 - acc)], n_params=5000, wall_time_s=10.0,
                                    tokens=1200, tokens_per_s=120.0, peak_memory_bytes=5 * 2**20,
                                    peak_memory_instrument="train_step_live_tensor_bytes",
                                    environment={"device": "cpu"}))
    index = write_report(tmp_path / "out", tmp_path / "reports", pictures=False)
    measured = index.with_name("measured.html")
    measured.write_text(index.read_text().replace("</body>", MEASURE_TABLES))
    with tempfile.TemporaryDirectory() as profile:
        run = [*CHROMIUM, f"--user-data-dir={profile}", "--window-size=1280,2400"]
        dom = run_within_cpu([*run, "--virtual-time-budget=3000", "--dump-dom", measured.resolve().as_uri()],
                             CHROMIUM_CPU_S, text=True, check=True).stdout
        screenshot = tmp_path / "report-1280.png"
        run_within_cpu([*run, f"--screenshot={screenshot}", index.resolve().as_uri()], CHROMIUM_CPU_S, check=True)
    layout = json.loads(re.search(r'<pre id="measured">(.*?)</pre>', dom, re.S).group(1).replace("&quot;", '"'))
    assert layout["view"] == 1280 and layout["page"] <= layout["view"]  # the page itself never scrolls sideways
    assert max(t["columns"] for t in layout["tables"]) >= 8  # the leaderboards: variant, interval, Δ, measures
    for table in layout["tables"]:
        assert table["boxRight"] <= layout["view"] and table["table"] <= table["box"], table  # every column shows
        assert table["scrolls"]  # and a table wider than a narrower window would scroll in its own box
    assert png_size(screenshot)[0] == 1280


# ---- scaling ---------------------------------------------------------------------------------

# Constructed costs: naive attention n^2 FLOPs over an n^1 rest, full fused n^2 time; decode
# with the cache ~n^1, without ~n^2; the cache holds 2 * layers * kv heads * hd * n * 4 bytes.
def scaling_row(attention: str, mode: str, n: int, cache: bool | None) -> dict:
    shape = {"n_heads": 2, "head_dim": 8, "batch_size": 1}
    if mode == "forward":
        # useful: the causal pairs; executed: naive the whole n x n matrix, full (tiled) three quarters of it
        useful, whole, rest = 4.0 * 16 * n * (n + 1) / 2, 4.0 * n * n * 16, 24.0 * n * 16 * 16
        executed = whole if attention == "naive" else 0.75 * whole
        return {"time_median_s": 1e-9 * n ** 2, "time_q25_s": 0.9e-9 * n ** 2, "time_q75_s": 1.2e-9 * n ** 2,
                "time_instrument": "perf_counter", "flops": useful + rest, "flops_executed": executed + rest,
                "flops_source": "allowed_pairs+flop_counter(rest)", "flops_executed_source": "flop_counter",
                "flops_attention": useful, "flops_executed_attention": executed,
                "flops_projections": 8.0 * n * 16 * 16, "flops_ffn": 16.0 * n * 16 * 16, **shape}
    per_token = 1e-6 * n if cache else 1e-8 * n ** 2
    return {"time_median_s": per_token, "time_instrument": "perf_counter", "flops": 1000.0 * n,
            "flops_source": "flop_counter", "kv_cache_bytes": 2 * 1 * 2 * 8 * n * 4 if cache else None}


@pytest.fixture(scope="module")
def scaling_report(tmp_path_factory):
    from workbench.recipes.scaling.measuring import COORDINATES, measurement_id, measurements

    root = tmp_path_factory.mktemp("scaling")
    (root / "study.yaml").write_text(SCALING_STUDY)
    study_file = load_study(root / "study.yaml")
    out = root / "out"
    store = Store(out)
    save_study(store, study_file)
    for index, (swept, point) in enumerate(measurements(study_file.study)):
        attention = swept["model.attention"]
        oom = attention == "naive" and point.mode == "forward" and point.length == 512
        figures = {} if oom else scaling_row(attention, point.mode, point.length, point.kv_cache)
        run = RunConfig(run_id=measurement_id(point.model, point), index=index, seed=point.seed,
                        swept={**swept, **{c: getattr(point, c) for c in COORDINATES}},
                        config={"model": point.model})
        store.record(run, RunResult(
            run_id=run.run_id, status="oom" if oom else "finished", error="RuntimeError: out of memory" if oom else None,
            metrics={k: v for k, v in figures.items() if v is not None}, wall_time_s=1.0,
            peak_memory_bytes=None if oom else 1000 * point.length, peak_memory_instrument="process_peak_rss",
            # the first measurement ended on a busy machine: a load above its 2 cores
            environment={"device": "cpu", "torch_version": torch.__version__, "load_1m": 3.1 if index == 0 else 0.4,
                         "cores": 2}))
    return write_report(out, root / "reports")


def test_scaling_report(scaling_report):
    index = scaling_report
    page = parse(index.read_text())
    markdown = (index.parent / "report.md").read_text()
    sections = markdown.split("\n## ")
    timed = [s.splitlines()[0] for s in sections if "Caveat: these timings come from a shared machine (the load " in s]
    assert timed == ["Fitted exponents", "Cost against length", "Decoding", "All measurements"]  # one line each
    assert "load_1m" not in markdown  # per-run load is read for the caveat, not listed as environment
    exponents = next(t for t in page.tables if t[0][:4] == ["variant", "mode", "metric", "exponent [95% CI]"])
    found = {(r[0], r[1], r[2]): r[3] for r in exponents[1:]}
    assert found[("attention=full", "forward", "time_median_s")].startswith("2.00 [2.00, 2.00]")
    assert found[("attention=full", "decode (cache)", "time_median_s")].startswith("1.00")
    assert found[("attention=full", "decode (no cache)", "time_median_s")].startswith("2.00")
    assert found[("attention=naive", "decode (cache)", "kv_cache_bytes")].startswith("1.00")
    # naive forward lost its largest length to OOM: fitted on three points, and listed.
    assert found[("attention=naive", "forward", "time_median_s")].startswith("2.00")
    failed = next(t for t in page.tables if t[0] == ["variant", "mode", "length", "status", "message"])
    assert failed[1:] == [["attention=naive", "forward", "512", "oom", "RuntimeError: out of memory"]]
    # Crossover, executed by the naive kernel: 4 n^2 d = 24 n d^2 at n = 6 d = 96, as the formula says;
    # useful (causal pairs): 2 n (n + 1) d = 24 n d^2 at n = 12 d - 1 = 191.
    crossover = next(t for t in page.tables if t[0][0] == "variant" and "measured crossover n" in t[0])
    cells = {(r[0], r[1]): r[2:] for r in crossover[1:]}
    naive_executed, naive_useful = cells[("attention=naive", "executed")], cells[("attention=naive", "useful")]
    assert naive_executed[0].startswith("96 ") and naive_executed[1].startswith("96 (6 d)")
    assert naive_useful[1].startswith("191 ") and naive_useful[0].startswith("19")
    assert cells[("attention=full", "useful")] == cells[("attention=naive", "useful")]  # the same useful work
    assert cells[("attention=full", "executed")][1] == "–"  # a tiled kernel has no closed formula
    # Scope line: decode measures the whole model; time figures carry their quartiles.
    assert "Scope: layer (forward); the whole model (decode)" in index.read_text()
    # Nothing is trained: the header says no learned criterion applies.
    assert (index.parent / "report.md").read_text().split("\n\n")[2] == (
        "Learned: no learned criterion applies: nothing is trained for quality here (this study measures cost)")
    measured = next(t for t in page.tables if t[0][:4] == ["variant", "mode", "length", "status"] and len(t[0]) > 5)
    assert any("[" in row[4] for row in measured[1:])
    names = {Path(img["src"]).name for img in page.images}
    assert {"time_forward.png", "flops_forward.png", "memory_forward.png", "decode_time.png", "decode_flops.png",
            "kv_cache_bytes.png", "crossover_1.png"} <= names
    for img in page.images:
        assert min(png_size(index.parent / img["src"])) > 150


def test_training_report_header_states_the_learned_criterion(train_report):
    """Right under the question: the threshold at the training length, from the same gate
    objects as the Learned section's table (chance, the margin, the perfect score), and who met it."""
    _, _, index = train_report
    page = parse(index.read_text())
    table = next(t for t in page.tables if t[0][:2] == ["variant", "at the training length"])
    assert table[0][3:] == ["input-ignoring", "learned: ≥", "learned",
                            "diverged or did not learn [95% CI]"]  # translate's one
    chance, needed = {row[3] for row in table[1:]}, {row[4] for row in table[1:]}
    states = [row[5] for row in table[1:]]
    assert len(chance) == len(needed) == 1 and set(states) <= {"learned", "did not learn", "undetermined"}
    assert table[1][6] == "0/5 = 0 [0, 0.522]"  # Clopper-Pearson: 0 of 5 seeds failed
    learned = states.count("learned")
    outcome = "all 3 groups learned" if learned == 3 else f"{learned} of 3 groups learned"
    line = (f"Learned (accuracy@6 ≥ {needed.pop()}, 10% of the way from input-ignoring {chance.pop()} to 1; learned "
            f"when the 95% interval of the mean lies past it): {outcome}")
    texts = [t.strip() for t in page.text if t.strip()]
    assert texts[texts.index(TRAIN_STUDY_QUESTION) + 1].startswith(line)  # the line after the question
    md = (index.parent / "report.md").read_text().split("\n\n")
    assert md[2].startswith(line) and md[3] == "## Verdicts"
    summary = json.loads((index.parent / "summary.json").read_text())
    assert summary["learned_criterion"][0].startswith(line) and len(summary["learned_criterion"]) == 1


def test_timings_from_a_shared_machine_carry_one_caveat_line():
    from workbench.report import timing_caveat

    def record(end_s: int, wall: float, load: float = 0.5):
        return {"recorded_at": f"2026-01-01T00:{end_s // 60:02d}:{end_s % 60:02d}+00:00", "wall_time_s": wall,
                "environment": {"load_1m": load, "cores": 2}}

    one_after_another = [record(10, 9.5), record(20, 9.5), record(30, 9.5)]
    assert timing_caveat(one_after_another) is None
    two_workers = [record(10, 10), record(12, 11), record(21, 9), record(23, 10)]
    assert "up to 2 runs trained at the same time" in timing_caveat(two_workers)
    busy = [record(10, 9.5), record(20, 9.5, load=3.4)]
    assert "the load exceeded the 2 cores at the end of 1 of 2 runs" in timing_caveat(busy)
    assert timing_caveat(busy, overlap=False).startswith("Caveat: these timings come from a shared machine")


def test_the_source_commit_is_dirty_for_edited_code_not_for_rebuilt_reports(tmp_path):
    def git(*args):
        subprocess.run(["git", *args], cwd=tmp_path, check=True, capture_output=True)

    (tmp_path / "reports").mkdir()
    (tmp_path / "code.py").write_text("x = 1\n")
    (tmp_path / "reports" / "report.md").write_text("old\n")
    git("init", "-q")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qam", "init", "--allow-empty")
    git("add", ".")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "files")
    clean = git_commit(tmp_path)
    assert clean is not None and len(clean) == 40 and short_commit(clean) == clean[:12]
    (tmp_path / "reports" / "report.md").write_text("rebuilt\n")
    assert git_commit(tmp_path) == clean  # a rebuilt report is output, not source
    (tmp_path / "code.py").write_text("x = 2\n")
    assert git_commit(tmp_path) == clean + "+dirty"
    assert short_commit(clean + "+dirty") == clean[:12] + "+dirty" and short_commit(None) == "not recorded"


def test_the_first_screen_is_a_verdict_table_and_a_figure_per_verdict_metric(train_report):
    """Right under the question: one row per expect: entry (claim, outcome badge, difference with
    its interval, seeds), then the verdict metric's figure; the rule and the long detail lines
    are folded into a <details> below, in the HTML and the Markdown alike."""
    _, _, index = train_report
    html = index.read_text()
    page = parse(html)
    summary = json.loads((index.parent / "summary.json").read_text())
    table = next(t for t in page.tables if t[0] == ["claim", "outcome", "difference [CI]", "seeds"])
    assert len(table) - 1 == len(summary["verdicts"]) == 3
    for row, v in zip(table[1:], summary["verdicts"]):
        assert row[0].startswith(v["statement"]) and row[1].startswith(v["outcome"])
        assert row[3] == " vs ".join(str(g["n"]) for g in v["groups"])
    holds = table[1]
    d = summary["verdicts"][0]["difference"]
    level = f"{d['level']:.1%}".replace(".0%", "%")  # Holm-widened: three comparisons
    assert holds[2] == f"{fmt_signed_interval(d['mean'], d['lo'], d['hi'])}{level} paired"
    assert re.findall(r'<span class="badge ([\w-]+)">', html) == ["holds", "does-not-hold", "inconclusive"]
    first_screen, rest = html.split("<details>", 1)
    assert "verdict_accuracy_10.png" in first_screen and html.index("<details>") < html.index("<nav>")
    assert "Holm" not in first_screen and "How each verdict was decided" in rest.split("</details>")[0]
    assert png_size(index.parent / "figures" / "verdict_accuracy_10.png")[0] > 300

    md = (index.parent / "report.md").read_text()
    verdicts_md = md.split("## Verdicts")[1].split("\n## ")[0]
    rows = [line for line in verdicts_md.splitlines() if line.startswith("| position=")]
    assert len(rows) == 3
    assert rows[0].startswith("| position=alibi is better than position=sinusoidal on accuracy@10 | **holds**")
    assert verdicts_md.index("![") < verdicts_md.index("<details>") < verdicts_md.index("_Rule:")


def test_an_outcome_without_a_badge_of_its_own_gets_the_neutral_one():
    from workbench.report.document import Report, VerdictLine
    from workbench.stats.outcomes import Outcome
    from workbench.report.render import render_html

    line = VerdictLine(statement="a is better than b on loss@8", outcome=Outcome.IDENTICAL,
                       label="identical (both groups gave the same loss@8 on every seed)", detail="",
                       groups=[{"n": 2}, {"n": 2}])
    html = render_html(Report(name="r", kind="train", question="q", verdicts=[line], sections=[]))
    assert '<span class="badge identical">identical</span>' in html
    assert "both groups gave the same loss@8" in html and "<td class=\"num\">–</td>" in html
    style = re.search(r"\.outcome, \.badge \{([^}]*)\}", html).group(1)
    assert "background" in style  # the neutral look every badge starts from
    assert ".identical {" not in html
    for outcome in Outcome:  # each badge the type colours is styled by its class
        if outcome.badge:
            assert f".{outcome.css_class} {{ background: {outcome.badge.background}; color: {outcome.badge.text}; }}" \
                in html


@pytest.mark.skipif(not any(map(shutil.which, screenshot_tool.CHROMIUM_NAMES)), reason="Chromium is not installed")
def test_at_1400_by_900_the_first_screen_shows_the_verdict_table_and_a_verdict_figure(train_report, tmp_path):
    _, _, index = train_report
    measured = index.with_name("first-screen-measured.html")
    measured.write_text(index.read_text().replace("</body>", MEASURE_FIRST_SCREEN))
    dom = screenshot_tool.chromium("--window-size=1400,900", "--virtual-time-budget=3000", "--dump-dom",
                                   measured.resolve().as_uri(), timeout=HANG_GUARD_S)
    layout = json.loads(re.search(r'<pre id="measured">(.*?)</pre>', dom, re.S).group(1).replace("&quot;", '"'))
    # --dump-dom lays the page out in the window less its (headless) frame; --screenshot takes
    # the full 1400 x 900: the first screen is what lies above 900 px at 1400 px wide.
    assert layout["view"][0] == 1400
    assert layout["table_bottom"] <= 900 and layout["figure_top"] < 900  # both on the first screen
    assert layout["figure_loaded"] and layout["figure_width"] > 250
    assert layout["details_open"] is False  # the rule is folded
    png = screenshot_tool.screenshot(index.parent, tmp_path / "first.png", timeout=HANG_GUARD_S)
    assert png_size(png) == (1400, 900)


# Measured once the page (its images too) has loaded, written into the page for --dump-dom.
MEASURE_FIRST_SCREEN = """<script>
addEventListener("load", () => {
  const table = document.querySelector(".verdict-table"), img = document.querySelector(".verdict-figures img");
  const out = document.createElement("pre");
  out.id = "measured";
  out.textContent = JSON.stringify({view: [innerWidth, innerHeight], table_bottom: table.getBoundingClientRect().bottom,
    figure_top: img.getBoundingClientRect().top, figure_loaded: img.complete && img.naturalWidth > 0,
    figure_width: img.getBoundingClientRect().width, details_open: document.querySelector("details").open});
  document.body.append(out);
});
</script></body>"""


def test_screenshot_mistakes_are_one_line(tmp_path):
    from click.testing import CliRunner

    from workbench.cli import main

    for args, fragment in ((["screenshot", str(tmp_path), "--size", "1400"], "--size: expected WIDTHxHEIGHT"),
                           (["screenshot", str(tmp_path)], "is not a report page")):
        result = CliRunner().invoke(main, args)
        assert result.exit_code == 2 and fragment in result.stderr and len(result.stderr.strip().splitlines()) == 1


def test_a_paired_verdict_shows_how_its_seeds_correlate(train_report):
    """Pearson r of the two groups over their common seeds, in the verdict's detail and summary.json;
    a Welch difference (rope lost a seed) has none."""
    _, _, index = train_report
    summary = json.loads((index.parent / "summary.json").read_text())
    # alibi [0.90, 0.91, 0.92] against sinusoidal [0.50, 0.52, 0.51]: r = 0.5
    r = [v["difference"]["r"] for v in summary["verdicts"]]
    assert r[:2] == [pytest.approx(0.5), pytest.approx(0.5)] and r[2] is None
    assert "Holm-adjusted p" in summary["verdicts"][0]["detail"]
    assert ", seeds' correlation r 0.5)" in summary["verdicts"][0]["detail"]
    assert "correlation" not in summary["verdicts"][2]["detail"]
