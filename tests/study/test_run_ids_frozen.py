"""Run ids and study hashes are computed the same way by every version of the code.

`tests/data/frozen_studies/` holds copies of the shipped studies as they were on 2026-12-01,
and `run_ids.json` what the code of that day computed for them (`workbench run --dry-run`'s
ids and hash, the tuning runs and every adaptive seed included; each profile too). The shipped
studies change with their findings; these copies never do, so a refactoring that changes how
an id is computed (and so orphans every stored result) fails here.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from workbench.recipes.scaling.measuring import measurement_runs
from workbench.recipes.train.study import TrainStudy
from workbench.study import load_study
from workbench.study.keys import label
from workbench.recipes.train.sweep import expand, point_key, tuning_runs

FROZEN = Path(__file__).resolve().parents[1] / "data" / "frozen_studies"
EXPECTED: dict[str, dict[str, Any]] = json.loads((FROZEN / "run_ids.json").read_text())


def identities(path: Path, profile: str | None) -> dict[str, Any]:
    """The study hash and the ids of every run the study can have: each final run at every
    seed an adaptive plan may add (at each tuning candidate, with `tune:`), each tuning run;
    a scaling study's measurements."""
    study_file = load_study(path, profile)
    study = study_file.study
    if not isinstance(study, TrainStudy):
        return {"hash": study_file.study_hash, "runs": [run.run_id for run in measurement_runs(study)], "tuning": []}
    points = [point_key({k: label(v) for k, v in p.items()}, study.sweep.keys) for p in study.sweep.points()]
    seeds = dict.fromkeys(points, len(study.every_seed))
    choices = [dict.fromkeys(points, values) for values in study.tune.points()] if study.tune else [None]
    return {"hash": study_file.study_hash,
            "runs": [run.run_id for chosen in choices for run in expand(study_file, chosen, seeds)],
            "tuning": [run.run_id for run in tuning_runs(study_file)]}


def cases() -> list[tuple[str, str | None]]:
    return [(name, profile or None) for name, profiles in sorted(EXPECTED.items()) for profile in profiles]


def test_every_frozen_study_has_its_ids():
    assert sorted(EXPECTED) == sorted(p.name for p in FROZEN.glob("*.yaml"))


@pytest.mark.parametrize(("name", "profile"), cases(), ids=lambda v: str(v))
def test_run_ids_and_hash_are_unchanged(name, profile):
    assert identities(FROZEN / name, profile) == EXPECTED[name][profile or ""]
