"""Study files: what every kind of study shares (StudyBase, the task section, dotted keys
checked against the fields they name) and loading; each kind's study class lives in its recipe
(workbench.recipes.train.study, workbench.recipes.scaling.study).

    keys.py       dotted keys, value labels, hashing (run ids, study hashes)
    yaml_file.py  YAML with a line map, size limits, profiles and `--set`, error hints
    train_section.py  the `train:` section (optimiser, budget, devices)
    sections.py   the `expect:`, `seeds:`, `sweep:` and `tune:` sections
    schema.py     the JSON Schema of study files

A study names a task, a model, a training budget and the seeds, and sweeps dotted keys:

    name: positions            task: {name: copy, train_length: 16}
    model: {d_model: 64, ...}  train: {steps: 500, batch_size: 32, lr: 1.0e-3}
    seeds: [0, 1]              sweep: {model.position: [none, rope, alibi]}

Loading is three steps, each reporting the first mistake as one line with file, line, field
path, problem and valid choices:

    YAML text --SafeLoader compose--> node tree (key -> line) + plain data
              --profile overrides--> data --pydantic (Study kind)--> validated study
    A kind's recipe then expands the study to its runs (workbench.recipes.train.sweep.expand
    validates every run's model spec).

The `kind` field selects the study class through the study-kind registry (workbench.kinds);
a new kind is a StudyBase subclass with its own section plus a StudyKind that runs and reports it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

from pydantic import ConfigDict, Field, ValidationError, ValidationInfo, field_validator

from workbench import kinds
from workbench.errors import SpecError
from workbench.registry import get_variant, variants
from workbench.study.task_paths import with_task_paths
from workbench.results import RUN_MEASURES
from workbench.model.spec import VARIANT_AXES, ModelSpec, spec_error_from
from workbench.study.keys import digest
from workbench.study.schema import study_json_schema
from workbench.study.sections import Expectation
from workbench.study.train_section import BUDGET_KINDS, TrainConfig
from workbench.study.yaml_file import LineMap, StudyError, apply_overrides, apply_profile, read_yaml, suggest
from workbench.variants import StrictModel

__all__ = ["load_study", "study_json_schema", "StudyFile", "StudyBase", "STORED", "RUN_MEASURES"]

SWEEPABLE_SECTIONS = ("task", "model", "train")
MAX_NAME_CHARS = 100  # a study's name names folders (runs/<name>, reports/.<name>.building-<pid>)


def task_section(value: Any) -> dict[str, Any]:
    """{name, **params} validated through the task registry; returns the resolved mapping."""
    if not isinstance(value, Mapping):
        raise SpecError("task", f"expected a mapping {{name: <task>, <params>}}, got {value!r}")
    raw = dict(value)
    if "name" not in raw:
        raise SpecError("task.name", "missing: the task section needs a name", sorted(variants("task")))
    name = raw.pop("name")
    cls = get_variant("task", str(name), "task.name")
    try:
        params = cls.Params.model_validate(raw)
    except ValidationError as err:
        raise unwrap(err, "task") from None
    return {"name": str(name), **params.model_dump()}


def unwrap(err: ValidationError, prefix: str = "", fields: Iterable[str] | None = None) -> SpecError:
    """A pydantic report as one SpecError: a SpecError raised inside a validator keeps its own
    field; otherwise the first error's location becomes the field path. `fields`: the top-level
    fields of the study class that was validated (for an unknown top-level key's hint)."""
    first = err.errors()[0]
    inner = (first.get("ctx") or {}).get("error")
    if isinstance(inner, SpecError):
        return inner
    if first["type"] == "extra_forbidden":
        path = ".".join(str(p) for p in (prefix, *first["loc"]) if p != "")
        parent = ".".join(path.split(".")[:-1])
        known = known_keys(parent, fields)
        return SpecError(path, "unknown key" + suggest(path.split(".")[-1], known), known)
    return spec_error_from(err, prefix)


def known_keys(section: str, fields: Iterable[str] | None = None) -> list[str] | None:
    """Field names valid inside a dotted section of a study (for 'unknown key' hints); the top
    level's are `fields`, the study class's."""
    tops = {
        "": list(fields) if fields is not None else None,
        "train": list(TrainConfig.model_fields),
        "model": list(ModelSpec.model_fields),
        "sweep": None,
    }
    if section in tops:
        return tops[section]
    if re.fullmatch(r"expect\.\d+", section):
        return list(Expectation.model_fields)
    return None


# ---- studies --------------------------------------------------------------------------------


class StudyBase(StrictModel):
    """Fields every kind of study has."""

    model_config = ConfigDict(extra="forbid")
    kind: str
    name: str = Field(
        pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$", max_length=MAX_NAME_CHARS,
        description=f"study name: letters, digits, '-', '_', '.', at most {MAX_NAME_CHARS}; the default output folder "
                    "is runs/<name>/ (a folder name: file systems allow 255 bytes)",
    )
    description: str = Field("", description="one line: the question the study answers")
    notes: str = Field("", description="free text shown in reports")
    seeds: list[Annotated[int, Field(ge=0, le=2**32 - 1)]] = Field(
        [0], min_length=1, description="every sweep point trains once per seed (0 .. 2^32-1)")
    profiles: dict[str, dict[str, Any]] = Field(
        {}, description="named overrides {profile: {dotted.key: value}}, applied by `workbench run --profile NAME`"
    )

    @field_validator("model", mode="before", check_fields=False)  # each kind declares its model field
    @classmethod
    def _model(cls, v):
        if v is None:
            return {}
        if not isinstance(v, Mapping):
            raise SpecError("model", f"expected a mapping of model fields, got {v!r}")
        return dict(v)

    def run_defining(self) -> dict[str, Any]:
        """The part of the study that determines which runs exist and what they compute: a
        change here, against an existing output folder, is a different study."""
        raise NotImplementedError


STORED = "stored"  # validation context: a study read back from a results store


def stored(info: ValidationInfo) -> bool:
    """A study read back from a store was checked against the registry when it ran; reading
    it again (for a report) must not need the plugins it used to still be installed."""
    return bool(info.context and info.context.get(STORED))


def check_key(key: str, field: str, task: dict[str, Any]) -> None:
    """A dotted key that a sweep or profile sets must name an existing field."""
    section, _, rest = key.partition(".")
    if section not in SWEEPABLE_SECTIONS or not rest:
        valid = [f"{s}.<field>" for s in SWEEPABLE_SECTIONS]
        raise SpecError(field, f"{key!r} is not a dotted key of a study field", valid)
    head, _, deeper = rest.partition(".")
    if section == "model":
        fields = list(ModelSpec.model_fields)
        if deeper and head not in VARIANT_AXES:
            raise SpecError(field, f"model.{head} has no sub-keys (only variant axes do: {', '.join(VARIANT_AXES)})")
    elif section == "train":
        fields = list(TrainConfig.model_fields)
    else:
        fields = ["name", *get_variant("task", task["name"]).Params.model_fields]
    if head not in fields:
        choices = [f"{section}.{f}" for f in fields]
        raise SpecError(field, f"no such key {key!r}" + suggest(f"{section}.{head}", choices), choices)
    if section == "train" and head == "budget" and deeper:
        if deeper not in BUDGET_KINDS:
            raise SpecError(field, f"no such key {key!r}", [f"train.budget.{k}" for k in BUDGET_KINDS])
        return
    if section != "model" and deeper:
        raise SpecError(field, f"{section}.{head} has no sub-keys")


@dataclass
class StudyFile:
    """A loaded study with where it came from, so later checks can point into the file."""

    path: Path
    text: str
    data: dict[str, Any]  # the YAML data after profile overrides
    lines: LineMap
    study: StudyBase
    profile: str | None = None
    overrides: tuple[str, ...] = ()  # `--set key=value` texts, in the order given

    def error(self, err: SpecError, context: str = "") -> StudyError:
        if context:
            err = SpecError(err.field, f"{err.problem} ({context})", err.choices)
        return StudyError(str(self.path), self.lines.line(err.field), err)

    def source_of(self, key: str) -> str | None:
        """The command-line option that set the dotted `key` ("--set KEY=VALUE", "--profile NAME"),
        or None when the study file itself does; the last one applied wins, as in loading."""
        prefixes = {".".join(key.split(".")[:i]) for i in range(1, key.count(".") + 2)}  # train, train.precision
        for text in reversed(self.overrides):
            if text.partition("=")[0].strip() in prefixes:
                return f"--set {text}"
        profile = (self.data.get("profiles") or {}).get(self.profile) if self.profile else None
        if isinstance(profile, Mapping) and prefixes & {str(k) for k in profile}:
            return f"--profile {self.profile}"
        return None

    @property
    def study_hash(self) -> str:
        return digest(self.study.run_defining())


def load_study(path: str | Path, profile: str | None = None, overrides: tuple[str, ...] | list[str] = ()) -> StudyFile:
    """Read and validate a study file, with a profile's and then the command line's overrides
    applied. Raises StudyError (a WorkbenchError) with file and line."""
    path = Path(path)
    file = str(path)
    text, data, lines = read_yaml(path)
    if not isinstance(data, Mapping):
        raise StudyError(file, 1, SpecError("", f"a study file is a mapping of fields (name, task, ...), got {type(data).__name__}"))
    data = dict(data)
    if profile is not None:
        data = apply_profile(data, profile, file, lines)
    overrides = tuple(overrides)
    if overrides:
        data = apply_overrides(data, overrides, file, lines)
    data = with_task_paths(data, path.absolute().parent)
    kind = data.get("kind", "train")
    registered = kinds.study_kinds()
    if not isinstance(kind, str) or kind not in registered:
        raise StudyError(file, lines.line("kind"),
                         SpecError("kind", f"unknown study kind {kind!r}" + suggest(str(kind), list(registered)),
                                   registered))
    cls = registered[kind].study
    try:
        study = cls.model_validate(data)
    except ValidationError as err:
        spec_err = unwrap(err, fields=cls.model_fields)
        raise StudyError(file, lines.line(spec_err.field), spec_err) from None
    except SpecError as err:
        raise StudyError(file, lines.line(err.field), err) from None
    return StudyFile(path=path, text=text, data=data, lines=lines, study=study, profile=profile, overrides=overrides)


