"""One report across several study folders: `workbench compare DIR...`.

    folders --(same task)--> every run, once (a run id trained in two folders is one run)
            --settings that tell the runs apart--> variant labels --> the training report

A variant added later (a second study with `model.position: [alibi]`) is compared with an
earlier sweep (`[none, rope]`) as if one study had swept all three: the variants are told
apart by every setting that differs between the runs (swept keys, and settings that differ
between the studies, such as `train.steps`), so runs that computed different things are never
pooled. Everything is read from the stores; nothing is trained.

The comparison is a training study like any other (its sweep holds each variant's values as the
folders' studies wrote them), so the report computes chance levels, the learned gate, deltas to
a baseline (`--baseline`, else the first folder's own) and verdicts on `--expect "A > B on
metric"` exactly as a study's report does (workbench.recipes.train.stats.verdicts).
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd
import yaml
from pydantic import ValidationError

from workbench.run import store
from workbench.errors import WorkbenchError
from workbench.registry import variants
from workbench.report import build_then_swap, merged_environment, report_destination, study_of, timing_caveat
from workbench.report import write_files
from workbench.report.index import write_summary
from workbench.recipes.train.pictures import ModelPictures
from workbench.recipes.train.report import train_report
from workbench.recipes.train.runs import TrainInputs
from workbench.report.sweep_points import short_key
from workbench.results import flatten
from workbench.variants import variant_names
from workbench.model.spec import VARIANT_AXES
from workbench.recipes.train.study import TrainStudy
from workbench.study import RUN_MEASURES, STORED, unwrap
from workbench.study.keys import get_dotted, label
from workbench.study.yaml_file import suggest


def setting_key(flat_key: str) -> str:
    """model.position.base -> model.position (a variant is labelled as a whole)."""
    parts = flat_key.split(".")
    if len(parts) > 2 and parts[0] == "model" and parts[1] in VARIANT_AXES:
        return ".".join(parts[:2])
    return flat_key


def setting_value(key: str, config: dict[str, Any]) -> Any:
    """A run's value of `key` as a study would write it: a variant with only its non-default
    parameters (`{name: sliding_window, window: 64}`, or just its name); others as stored."""
    axis = key.split(".")[1] if key.startswith("model.") else None
    if axis in VARIANT_AXES and axis not in config["model"]:  # an axis added after the run was stored
        return variant_names(config["model"], axis)[0]
    value = get_dotted(config, key)
    if axis in VARIANT_AXES and key.count(".") == 1:
        if isinstance(value, dict) and "repeat" in value:  # a per-layer pattern: each item so
            return {"repeat": [short_variant(axis, item) for item in value["repeat"]]}
        if isinstance(value, list):
            return [short_variant(axis, item) for item in value]
        return short_variant(axis, value)
    return value


def short_variant(axis: str, value: Any) -> Any:
    """A stored variant mapping with only its non-default parameters, or just its name."""
    if not isinstance(value, dict):
        return value
    cls = variants(axis).get(value["name"])
    defaults = {f: field.default for f, field in cls.Params.model_fields.items()} if cls else {}
    params = {k: v for k, v in value.items() if k != "name" and (k not in defaults or defaults[k] != v)}
    return {"name": value["name"], **params} if params else value["name"]


def value_label(key: str, config: dict[str, Any]) -> Any:
    """A run's value of `key` as its label (`sliding_window(window=64)`): the results column."""
    return label(setting_value(key, config))


def parse_expect(text: str) -> dict[str, Any]:
    """`"A > B on metric"` -> an `expect:` entry (A expected better than B; the direction is the
    metric's, as in a study). A and B are values as a study's `expect:` takes them: a swept value
    (`rope`, `sliding_window(window=4)`) or a YAML mapping `{model.position: rope, train.steps: 500}`."""
    pair, on, metric = text.rpartition(" on ")
    better, gt, than = pair.partition(">")
    if not (on and gt and better.strip() and than.strip() and metric.strip()):
        raise WorkbenchError(f"--expect {text!r}: write it as \"A > B on METRIC\" (A expected better than B), "
                             "e.g. --expect \"rope > none on accuracy@12\"")
    return {"metric": metric.strip(), "better": yaml_value(better), "than": yaml_value(than)}


def yaml_value(text: str) -> Any:
    """A value given on the command line, read as YAML data (never evaluated)."""
    try:
        return yaml.safe_load(text.strip())
    except yaml.YAMLError:
        return text.strip()


def distinguishing_keys(studies: Sequence[Any], configs: dict[str, dict[str, Any]]) -> list[str]:
    """Swept keys of any folder, then every setting the study files set differently (as
    written: a setting derived from another, such as eval_every from steps, is not one),
    when the runs' values of it differ."""
    written = [flatten({k: s.run_defining()[k] for k in ("task", "model", "train")}) for s in studies]
    keys = list(dict.fromkeys(k for flat in written for k in flat))
    differing = [setting_key(k) for k in keys
                 if len({json.dumps(flat.get(k), sort_keys=True, default=str) for flat in written}) > 1]
    swept = [k for s in studies for k in s.sweep.keys]
    return list(dict.fromkeys([*swept, *(k for k in differing if k not in swept and
                                         len({json.dumps(value_label(k, c), default=str) for c in configs.values()}) > 1)]))


def comparison_inputs(out_dirs: Sequence[str | Path], name: str, baseline: Any = None, expect: Sequence[str] = ()):
    """(study, runs, curves, environment, run folder of each run id) for the training report;
    `baseline` and `expect` ("A > B on metric") as a study's `baseline:` and `expect:` take them."""
    if len(out_dirs) < 2:
        raise WorkbenchError("compare: give at least two study folders")
    studies, frames, curves, configs, folder_of, environments = [], [], [], {}, {}, []
    for out_dir in map(Path, out_dirs):
        study = study_of(store.load_study_info(out_dir))
        if study.kind != "train":
            raise WorkbenchError(f"compare: {out_dir} holds a {study.kind} study; compare takes training studies")
        studies.append(study)
        runs = store.load_results(out_dir)
        new = [run_id for run_id in runs["run_id"] if run_id not in folder_of]
        folder_of.update({run_id: out_dir for run_id in new})
        frames.append(runs[runs["run_id"].isin(new)])
        curves.append(store.load_curves(out_dir).query("run_id in @new"))
        configs.update({k: v for k, v in store.load_run_configs(out_dir).items() if k in new})
        environments += [r["environment"] for r in store.Store(out_dir, create=False).runs() if r["run_id"] in new]
    tasks = {s.task["name"] for s in studies}
    if len(tasks) > 1:
        listed = ", ".join(f"{d} ({s.task['name']})" for d, s in zip(out_dirs, studies))
        raise WorkbenchError(f"compare: the folders trained different tasks ({listed}); their metrics do not compare")
    keys = distinguishing_keys(studies, configs)
    runs = pd.concat(frames, ignore_index=True)
    runs = runs.drop(columns=[c for s in studies for c in s.sweep.keys if c in runs.columns]).drop_duplicates("run_id")
    sweep: dict[str, list[Any]] = {}
    for key in keys:
        values = {run_id: setting_value(key, configs[run_id]) for run_id in runs["run_id"]}
        runs[key] = [label(values[run_id]) for run_id in runs["run_id"]]
        sweep[key] = list({json.dumps(label(v), default=str): v for v in values.values()}.values())
    runs["index"] = range(len(runs))  # sweep order across the folders, as given
    first = studies[0]
    swept_model = {k.split(".")[1] for k in keys if k.startswith("model.")}
    sources = [f"{d} (study {s.name!r}: {folder_variants(runs, keys, folder_of, Path(d))})"
               for d, s in zip(out_dirs, studies)]
    fields = {
        "name": name,
        "description": "Comparison of " + "; ".join(sources) + ".",
        "notes": "Runs of the folders " + ", ".join(f"{d} (study {s.name!r})" for d, s in zip(out_dirs, studies))
                 + ". Variants are told apart by every setting that differs between runs; a run found in several "
                 "folders counts once.",
        "task": first.task, "model": {k: v for k, v in first.model.items() if k not in swept_model},
        "train": first.train.model_dump(), "seeds": sorted({int(s) for s in runs["seed"]}),
        "sweep": sweep,
        "baseline": baseline if baseline is not None else carried_baseline(studies, sweep),
        "expect": [parse_expect(text) for text in expect],
    }
    study = compared_study(fields, expect, runs)
    return study, runs, pd.concat(curves, ignore_index=True), merged_environment(environments), folder_of


def compared_study(fields: dict[str, Any], expect: Sequence[str], runs: pd.DataFrame) -> TrainStudy:
    """The comparison as a train study, each problem named by the option that caused it."""
    try:
        study = TrainStudy.model_validate(fields, context={STORED: True})
    except ValidationError as err:
        problem = unwrap(err, fields=TrainStudy.model_fields)
        field = problem.field.split(".")
        option = ("--baseline" if field[0] == "baseline" else
                  f"--expect {expect[int(field[1])]!r}" if field[0] == "expect" else problem.field)
        valid = f" (valid: {', '.join(problem.choices)})" if problem.choices else ""
        raise WorkbenchError(f"compare: {option}: {problem.problem}{valid}") from None
    for text, exp in zip(expect, study.expect):
        if exp.metric not in runs.columns:
            known = [str(c) for c in runs.columns if "@" in str(c) or c in RUN_MEASURES]
            raise WorkbenchError(f"compare: --expect {text!r}: no run recorded the metric {exp.metric!r}"
                                 + suggest(exp.metric, known) + f" (valid: {', '.join(known)})")
    return study


def folder_variants(runs: pd.DataFrame, keys: Sequence[str], folder_of: dict[str, Path], folder: Path) -> str:
    """The variants whose runs a folder holds, as the report labels them, apart by " | " (a label
    of several keys holds commas itself)."""
    mine = runs[[folder_of[r] == folder for r in runs["run_id"]]]
    labels = [", ".join(f"{short_key(k)}={row[k]}" for k in keys) for _, row in mine.iterrows()]
    return " | ".join(dict.fromkeys(labels)) or "runs found in an earlier folder"


def carried_baseline(studies: Sequence[Any], sweep: dict[str, list[Any]]) -> Any:
    """The first folder's own baseline, when the comparison still sweeps what it fixes."""
    for study in studies:
        if study.baseline is not None and all(k in sweep for k in study.baseline):
            return study.baseline
    return None


def write_comparison(out_dirs: Sequence[str | Path], reports_dir: str | Path, name: str | None = None,
                     *, pictures: bool = True, baseline: Any = None, expect: Sequence[str] = ()) -> Path:
    """Write the report comparing the runs of `out_dirs` to REPORTS/<name>/; returns index.html.
    The default name joins the study names, or the folder names when the studies share one (so
    a comparison never takes the name, and the place, of a study's own report)."""
    names = [store.load_study_info(d).get("name") or Path(d).name for d in out_dirs]
    if len(set(names)) < len(names):
        names = [Path(d).resolve().name for d in out_dirs]
    name = name or "-vs-".join(dict.fromkeys(names))
    dest = report_destination(Path(reports_dir), name)
    study, runs, curves, environment, folder_of = comparison_inputs(out_dirs, name, baseline, expect)
    options = "".join(f" --baseline {shlex.quote(str(baseline))}" for _ in [baseline] if baseline is not None)
    options += "".join(f" --expect {shlex.quote(text)}" for text in expect)
    records = [r for d in out_dirs for r in store.Store(d, create=False).runs()
               if folder_of.get(r["run_id"]) == Path(d)]
    inputs = TrainInputs(
        study=study, runs=runs, curves=curves, environment=environment, timing_caveat=timing_caveat(records),
        command=f"workbench compare {' '.join(map(str, out_dirs))} --name {study.name}{options}",
        pictures=ModelPictures(lambda run_id: store.run_dir(folder_of[run_id], run_id)) if pictures else None,
    )

    def build(folder: Path) -> None:
        report, results = train_report(inputs, folder)
        write_files(report, results, folder)
        write_summary(folder, report, records)

    build_then_swap(dest, build)  # a comparison that fails to build leaves the previous one whole
    return dest / "index.html"
