"""The workbench from Python (a notebook, a script): run a study, read its results, verdicts and
report back, and use a trained model on text.

    from workbench import notebook
    done = notebook.run({"name": "mine", "task": {...}, "sweep": {...}, ...}, out="runs/mine")
    done.results      # pandas DataFrame, one row per run (workbench.run.store.load_results)
    done.verdicts     # one VerdictLine per `expect:` entry: statement, outcome, qualifier, difference, groups
    done.curves       # pandas DataFrame, one row per logged point, with each run's variant, seed and swept keys
    done.report       # path of the report's index.html
    trained = notebook.load_model(done.run_folder(variant="position=rope", seed=0))
    trained.generate("c a d a e")   # text in, text out: the run's own vocabulary

`run` is `workbench run` (the same store, resuming, report); a mapping is written to
OUT/study.yaml first, as a study file would be (a study is data: YAML, never code).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
import torch
import yaml

from workbench.api import run_study, study_verdicts, write_report
from workbench.errors import WorkbenchError
from workbench.model.weights import load_final_model, make_task
from workbench.report.document import VerdictLine
from workbench.report.findings import SUMMARY_FILE
from workbench.stats.outcomes import Outcome
from workbench.report.sweep_points import Variants, short_key
from workbench.study.keys import split_top, value_variant
from workbench.run import store

STUDY_COPY = "study.yaml"  # where `run` writes a study given as a mapping, inside its output folder


@dataclass
class StudyRun:
    """A study's output folder and its report; the results and verdicts read from them.

    `load` builds nothing: `results` and `run_folder` read the store, `verdicts` are decided
    from it when first asked (the report's verdict rule, without its figures or HTML), and
    `report` is an existing report's index.html (`write_report()` builds one)."""

    out_dir: Path
    index: Path | None = None  # the report's index.html; None: none was found (`write_report`)
    from_report: bool = False  # the report was just built from this store: its summary.json holds the verdicts
    _verdicts: list[VerdictLine] | None = field(default=None, repr=False)

    @property
    def report(self) -> Path:
        """The report's index.html; an error that says how to build one when there is none."""
        if self.index is None or not self.index.is_file():
            raise WorkbenchError(f"{self.out_dir}: no report of this study found beside it; `.write_report()` builds "
                                 "one (figures and HTML, seconds to minutes), `workbench report` too")
        return self.index

    def write_report(self, reports: str | Path | None = None) -> Path:
        """Build the report (default OUT/reports/NAME), as `run` does; returns its index.html."""
        self.index = write_report(self.out_dir, reports if reports is not None else self.out_dir / "reports")
        self.from_report, self._verdicts = True, None
        return self.index

    @property
    def results(self) -> pd.DataFrame:
        """One row per run: its swept values, seed, status and every metric (`workbench results`)."""
        return store.load_results(self.out_dir)

    @property
    def verdicts(self) -> list[VerdictLine]:
        """Each `expect:` entry's verdict: the report's record when this object built the report,
        otherwise decided from the store once, when first asked (no figures, no HTML)."""
        if self._verdicts is None:
            self._verdicts = summary_verdicts(self.index) if self.from_report else study_verdicts(self.out_dir)
        return self._verdicts

    @property
    def curves(self) -> pd.DataFrame:
        """Every logged point of every final run (run_id, step, split, metric, value) with the run's
        variant label, seed and swept keys as columns, to select and plot by, e.g.
        `curves.query("metric == 'loss' and split == 'eval'").groupby(["model.position", "step"])`."""
        runs = final_runs(self.out_dir)
        keys = [k for k in runs.attrs["variants"].keys if k in runs]
        return store.load_curves(self.out_dir).merge(runs[["run_id", "variant", "seed", *keys]], on="run_id")

    def run_folder(self, variant: str | None = None, seed: int = 0) -> Path:
        """The folder of the run of `variant` and `seed`. `variant` is the label the report prints
        (`position=rope`; with several swept keys `position=rope, norm=pre`), or enough of it to
        name one variant: some of its `key=value` parts, keys short or dotted (`model.position=rope`),
        bare values (`rope`), a parameterised value by its name (`norm=pre` for `pre(type=rmsnorm)`).
        With one variant, `variant` may be left out."""
        runs = final_runs(self.out_dir)
        labels = list(dict.fromkeys(runs["variant"]))
        if variant is None:
            if len(labels) > 1:
                raise WorkbenchError("run_folder: name the variant, one of:\n" + listed(labels))
            chosen = labels[0] if labels else None
        else:
            chosen = pick_variant(variant, runs.attrs["variants"])
        mine = runs[(runs["variant"] == chosen) & (runs["seed"] == seed)]
        if mine.empty:
            raise WorkbenchError(f"run_folder: no run of variant {chosen!r} with seed {seed} (seeds of it: "
                                 f"{', '.join(map(str, sorted(set(runs.loc[runs['variant'] == chosen, 'seed']))))})")
        return store.run_dir(self.out_dir, str(mine["run_id"].iloc[0]))


def listed(labels: Sequence[str]) -> str:
    """One variant label per line (a label holds commas of its own)."""
    return "\n".join(f"  {label}" for label in labels)


def summary_verdicts(index: Path) -> list[VerdictLine]:
    """The verdicts a report recorded in its summary.json."""
    records = json.loads((index.parent / SUMMARY_FILE).read_text(encoding="utf-8"))["verdicts"]
    return [VerdictLine(statement=r["statement"], outcome=Outcome(r["outcome"]), label=r["label"],
                        detail=r.get("detail", ""), note=r.get("note", ""), gates=r.get("learned", []),
                        difference=r.get("difference", {}), groups=r.get("groups", []), expect=r.get("expect", {}),
                        look=r.get("look"), post_hoc=r.get("post_hoc", ""), tests_claim=r.get("tests_claim", True),
                        qualifier=r.get("qualifier", ""), differs=r.get("differs", []), rung=r.get("rung", {}))
            for r in records]


def final_runs(out_dir: Path) -> pd.DataFrame:
    """The study's final runs (tuning runs aside) with the variant label the report prints
    (`attrs["variants"]`: the workbench.report.sweep_points.Variants they were labelled by)."""
    # the report layer and the train recipe load only when a run folder is asked for: `load` stays instant
    from workbench.recipes.train.runs import split_stages
    from workbench.report import study_of  # (the same)

    study = study_of(store.load_study_info(out_dir))
    runs, _ = split_stages(store.load_results(out_dir))
    keys = list(study.sweep.keys)
    variants = Variants.of(keys, runs, {k: study.sweep.values(k) for k in keys})
    runs = runs.assign(variant=variants.label_runs(runs))
    runs.attrs["variants"] = variants
    return runs


def pick_variant(name: str, variants: Variants) -> str:
    """The one variant label that `name` denotes (see `StudyRun.run_folder`); an error listing
    the candidates (or every variant), one per line, otherwise."""
    if name in variants.labels:
        return name

    def part_matches(part: str, key: str, value: str) -> bool:
        at, paren = part.find("="), part.find("(")
        keyed = at != -1 and (paren == -1 or at < paren)  # `norm=pre`, not the bare `layerscale(init_scale=0.1)`
        k, v = (part[:at].strip(), part[at + 1:].strip()) if keyed else ("", part)
        if keyed and k not in (key, short_key(key)):
            return False
        return v in (value, value_variant(value))

    parts = [p for p in split_top(name, ",") if p]
    found = [variants.label(point) for point in variants.points
             if parts and all(any(part_matches(p, k, v) for k, v in zip(variants.keys, point)) for p in parts)]
    if len(found) == 1:
        return found[0]
    if found:
        raise WorkbenchError(f"run_folder: {name!r} names {len(found)} variants; name one of them:\n" + listed(found))
    raise WorkbenchError(f"run_folder: no variant {name!r}; the variants are:\n" + listed(variants.labels))


def run(study: Mapping[str, Any] | str | Path, out: str | Path | None = None, *, jobs: int = 1,
        reports: str | Path | None = None, fresh: bool = False, overrides: Sequence[str] = (),
        quiet: bool = True) -> StudyRun:
    """Train every pending run of `study` (a study file's path, or the same fields as a mapping)
    into `out` (default runs/<name>), write its report to `reports` (default OUT/reports), and
    return both. `overrides` are `--set KEY=VALUE` texts."""
    if isinstance(study, Mapping):
        name = study.get("name")
        if not isinstance(name, str) or not name:
            raise WorkbenchError("name: a study needs a name (it names its output folder and report)")
        out_dir = Path(out) if out is not None else Path("runs") / name
        out_dir.mkdir(parents=True, exist_ok=True)
        path = out_dir / STUDY_COPY
        path.write_text(yaml.safe_dump(dict(study), sort_keys=False, allow_unicode=True), encoding="utf-8")
    else:
        path, out_dir = Path(study), Path(out) if out is not None else None
    summary = run_study(path, out_dir, jobs=jobs, fresh=fresh, quiet=quiet, overrides=tuple(overrides))
    index = write_report(summary.out_dir, reports if reports is not None else summary.out_dir / "reports")
    return StudyRun(Path(summary.out_dir), index, from_report=True)


def load(out: str | Path, reports: str | Path | None = None) -> StudyRun:
    """A finished study's folder, read as it stands: nothing trains and no report is built.
    `report` is the report found for it (in `reports`, else OUT/reports/NAME, or the report
    folder a shipped `data/` store lies in); `write_report()` builds one."""
    from workbench.report import DATA_DIR  # the report layer (jinja, matplotlib) loads with the first report

    out = Path(out)
    name = str((store.load_study_info(out).get("study") or {}).get("name", ""))
    found = [Path(reports if reports is not None else out / "reports") / name / "index.html"] if name else []
    if reports is None and out.name == DATA_DIR:
        found.append(out.parent / "index.html")
    return StudyRun(out, next((f for f in found if f.is_file()), None))


class Tokenizer:
    """A run's vocabulary as its task defines it: text to token ids and back, with no offsets to
    know (a byte model's ids are its bytes shifted past the special tokens)."""

    def __init__(self, task):
        self.task = task
        self.special = {task.pad_id, task.bos_id, task.eos_id, task.sep_id}

    def encode(self, text: str) -> list[int]:
        words = self.task.text_words(text)
        unknown = [w for w in words if w not in self.task.token_id]
        if unknown:
            raise WorkbenchError(f"encode: {unknown[0]!r} is not in the {self.task.name} vocabulary "
                                 f"({', '.join(self.task.vocab[len(self.special):][:12])}, ...)")
        return list(self.task.encode(words))

    def decode(self, ids: Sequence[int]) -> str:
        """The text of `ids`, special tokens (padding, <bos>, <eos>, <sep>) left out."""
        return self.task.words_text([w for i, w in zip(ids, self.task.decode(ids)) if int(i) not in self.special])


@dataclass
class TrainedModel:
    """A finished run's model (eval mode), its resolved run config and its tokenizer."""

    model: torch.nn.Module
    config: dict[str, Any]
    tokenizer: Tokenizer

    def generate(self, text: str, max_new_tokens: int = 32, **options: Any) -> str:
        """The model's continuation of `text` (a decoder; an encoder-decoder translates it),
        without the prompt; `options` go to the model's `generate` (strategy, temperature, top_p)."""
        task, source = self.tokenizer.task, self.tokenizer.encode(text)
        decoder = self.config["model"]["family"] == "decoder"
        ids = torch.tensor([task.decoder_prompt(source) if decoder else source])
        with torch.no_grad():
            out = self.model.generate(ids, max_new_tokens=max_new_tokens, eos_id=task.eos_id, pad_id=task.pad_id,
                                      **options)
        new = out[0, ids.shape[1]:] if decoder else out[0, 1:]  # an encoder-decoder's output starts with <bos>
        return self.tokenizer.decode(new.tolist())


def load_model(run_folder: str | Path) -> TrainedModel:
    """The trained model of a finished run folder (`StudyRun.run_folder`), ready for text."""
    model, config = load_final_model(run_folder)
    return TrainedModel(model, config, Tokenizer(make_task(config)))
