"""The workbench from Python (a notebook, a script): run a study, read its results, verdicts and
report back, and use a trained model on text.

    from workbench import notebook
    done = notebook.run({"name": "mine", "task": {...}, "sweep": {...}, ...}, out="runs/mine")
    done.results      # pandas DataFrame, one row per run (workbench.run.store.load_results)
    done.verdicts     # one VerdictLine per `expect:` entry: statement, outcome, difference, groups
    done.report       # path of the report's index.html
    trained = notebook.load_model(done.run_folder(variant="position=rope", seed=0))
    trained.generate("c a d a e")   # text in, text out: the run's own vocabulary

`run` is `workbench run` (the same store, resuming, report); a mapping is written to
OUT/study.yaml first, as a study file would be (a study is data: YAML, never code).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
import torch
import yaml

from workbench.api import run_study, write_report
from workbench.errors import WorkbenchError
from workbench.model.weights import load_final_model, make_task
from workbench.report.document import VerdictLine
from workbench.report.findings import SUMMARY_FILE
from workbench.report.outcomes import Outcome
from workbench.run import store

STUDY_COPY = "study.yaml"  # where `run` writes a study given as a mapping, inside its output folder


@dataclass(frozen=True)
class StudyRun:
    """A study's output folder and its report; the results and verdicts read from them."""

    out_dir: Path
    report: Path  # index.html

    @property
    def results(self) -> pd.DataFrame:
        """One row per run: its swept values, seed, status and every metric (`workbench results`)."""
        return store.load_results(self.out_dir)

    @property
    def verdicts(self) -> list[VerdictLine]:
        """Each `expect:` entry's verdict as the report decided it (its summary.json)."""
        records = json.loads((self.report.parent / SUMMARY_FILE).read_text(encoding="utf-8"))["verdicts"]
        return [VerdictLine(statement=r["statement"], outcome=Outcome(r["outcome"]), label=r["label"],
                            detail=r.get("detail", ""), note=r.get("note", ""), gates=r.get("learned", []),
                            difference=r.get("difference", {}), groups=r.get("groups", []), expect=r.get("expect", {}))
                for r in records]

    def run_folder(self, variant: str | None = None, seed: int = 0) -> Path:
        """The folder of the run of `variant` (its label, as `results` shows it) and `seed`; with one
        variant, `variant` may be left out."""
        table = pd.read_csv(self.report.parent / "results.csv")
        mine = table[(table["seed"] == seed) & ((table["variant"] == variant) if variant is not None else True)]
        if variant is None and table["variant"].nunique() > 1:
            raise WorkbenchError(f"run_folder: name the variant, one of {', '.join(dict.fromkeys(table['variant']))}")
        if mine.empty:
            raise WorkbenchError(f"run_folder: no run of variant {variant!r} with seed {seed} (variants: "
                                 f"{', '.join(dict.fromkeys(table['variant']))}; seeds: "
                                 f"{', '.join(map(str, sorted(set(table['seed']))))})")
        return store.run_dir(self.out_dir, str(mine["run_id"].iloc[0]))


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
    return StudyRun(Path(summary.out_dir), index)


def load(out: str | Path, reports: str | Path | None = None) -> StudyRun:
    """A finished study's folder, its report rebuilt from the store (nothing trains)."""
    out = Path(out)
    return StudyRun(out, write_report(out, reports if reports is not None else out / "reports"))


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
