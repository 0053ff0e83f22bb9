"""A study file as text, plain data and a line map, so every error names file, line and field;
size limits; profile and `--set` overrides; "did you mean" hints."""

from __future__ import annotations

import copy
import os
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from workbench.errors import SpecError, WorkbenchError, WorkbenchWarning, closest
from workbench.study.keys import canonical_json, label, set_dotted


class StudyError(WorkbenchError):
    """A mistake in a study file, located as `file:line: field: problem (valid: ...)`."""

    def __init__(self, file: str, line: int | None, error: SpecError | str):
        self.file, self.line = file, line
        self.field = error.field if isinstance(error, SpecError) else ""
        where = f"{file}:{line}" if line else file
        if line == 0:  # a field the command line set (--set)
            where = f"{file} with --set"
        super().__init__(f"{where}: {error}")


class LineMap:
    """Dotted field path -> 1-based line of the YAML key (or list item) that holds it."""

    def __init__(self) -> None:
        self.lines: dict[str, int] = {}

    @classmethod
    def of(cls, node: yaml.Node | None, file: str) -> LineMap:
        out = cls()
        if node is not None:
            out._walk(node, "", file)
        return out

    def _walk(self, node: yaml.Node, prefix: str, file: str) -> None:
        if isinstance(node, yaml.MappingNode):
            seen: set[str] = set()
            for key_node, value_node in node.value:
                key = str(key_node.value)
                path = f"{prefix}.{key}" if prefix else key
                if key in seen:  # SafeLoader would silently keep the last one
                    raise StudyError(file, key_node.start_mark.line + 1, SpecError(path, "duplicate key"))
                seen.add(key)
                self.lines[path] = key_node.start_mark.line + 1
                self._walk(value_node, path, file)
        elif isinstance(node, yaml.SequenceNode):
            for i, item in enumerate(node.value):
                path = f"{prefix}.{i}"
                self.lines[path] = item.start_mark.line + 1
                self._walk(item, path, file)

    def line(self, field: str) -> int | None:
        """Line of `field`, or of its closest enclosing field that the file spells out."""
        parts = field.split(".")
        while parts:
            found = self.lines.get(".".join(parts))
            if found is not None:
                return found
            parts.pop()
        return None


def read_yaml(path: Path) -> tuple[str, Any, LineMap]:
    """Text, plain data and line map of a YAML file; safe loading only (no Python objects)."""
    file = str(path)
    try:
        if path.exists() and not path.is_file():
            raise WorkbenchError(f"{file}: not a regular file; a study is a YAML file")
        with path.open("rb") as handle:
            raw = handle.read(MAX_STUDY_BYTES + 1)
        if len(raw) > MAX_STUDY_BYTES:
            raise WorkbenchError(f"{file}: over {MAX_STUDY_BYTES // 2**20} MiB; a study is a short YAML file "
                                 "(sweep ranges, not written-out runs)")
        text = raw.decode("utf-8")
    except FileNotFoundError:
        raise WorkbenchError(f"{file}: study file not found") from None
    except OSError as err:
        raise WorkbenchError(f"{file}: cannot read the study file ({err.strerror})") from None
    except UnicodeDecodeError:
        raise WorkbenchError(f"{file}: not a text (UTF-8) file; a study is a YAML file") from None
    data, node = parse_yaml(text, file)
    return text, data, LineMap.of(node, file)


def parse_yaml(text: str, file: str, located: bool = True) -> tuple[Any, yaml.Node | None]:
    """Plain data and node tree of YAML text (a study file's; a `--set` value's is not `located`
    by line),
    with the limits applied before anything is built: nodes and alias expansion
    (WORKBENCH_MAX_YAML_NODES), nesting depth, no alias inside the value it names; a scalar
    YAML reads as a date or a number but cannot build (2001-02-30, 0x_) is one StudyError."""
    try:
        loader = yaml.SafeLoader(text)
    except yaml.reader.ReaderError as err:  # a control character (NUL, say): YAML reads printable text only
        line = text[:err.position].count("\n") + 1 if isinstance(err.position, int) else None
        raise StudyError(file, line if located else None, f"malformed YAML: it holds the character "
                         f"#x{err.character:04x} ({err.reason}); a study file is plain text, without control "
                         "characters") from None
    try:
        node = loader.get_single_node()
        memo: dict[int, int] = {}
        size = expanded_size(node, memo)
        if len(memo) > limit("WORKBENCH_MAX_YAML_NODES"):
            raise StudyError(file, None, f"it holds {len(memo)} YAML values, over the limit of "
                             f"{limit('WORKBENCH_MAX_YAML_NODES')}: sweep fewer values, or set "
                             "WORKBENCH_MAX_YAML_NODES to allow it")
        if size > limit("WORKBENCH_MAX_YAML_NODES"):
            raise StudyError(file, None, f"its YAML aliases (*name) expand to {size:.3g} nodes, over the limit of "
                             f"{limit('WORKBENCH_MAX_YAML_NODES')}: write the values out, or set "
                             "WORKBENCH_MAX_YAML_NODES to allow it")
        try:
            data = loader.construct_document(node) if node is not None else None
        except ValueError as err:  # a date or number that does not exist; int(): more than 4300 digits
            if "digits" in str(err):
                raise StudyError(file, None, "it holds a number with more than 4300 digits; no study setting "
                                 "needs one") from None
            raise unbuildable_scalar(node, err, file, located) from None
    except RecursionError:
        raise StudyError(file, None, "its YAML is nested too deeply (lists or mappings inside each other "
                         "hundreds of levels deep); a study needs a few levels") from None
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None) or getattr(err, "context_mark", None)
        problem = getattr(err, "problem", None) or str(err)
        context = getattr(err, "context", None)
        message = f"malformed YAML: {problem}" + (f" ({context})" if context else "")
        raise StudyError(file, mark.line + 1 if mark and located else None, message) from None
    finally:
        loader.dispose()
    return data, node


def unbuildable_scalar(root: yaml.Node, err: ValueError, file: str, located: bool) -> StudyError:
    """The StudyError for the first scalar under `root` that YAML's resolver reads as a date or
    a number and its constructor cannot build, at that scalar's line."""
    constructor = yaml.constructor.SafeConstructor()
    nodes = [root]
    while nodes:
        node = nodes.pop()
        if isinstance(node, yaml.ScalarNode):
            try:
                constructor.construct_object(node)
            except ValueError as problem:
                what = "date" if node.tag.endswith(":timestamp") else "number"
                reason = str(problem).splitlines()[0][:80]
                return StudyError(file, node.start_mark.line + 1 if located else None,
                                  f"{node.value[:40]!r} reads as a YAML {what} but is not one ({reason}); "
                                  "quote it to make it text, or write a valid value")
        elif isinstance(node, yaml.MappingNode):
            nodes += [item for pair in reversed(node.value) for item in reversed(pair)]
        elif isinstance(node, yaml.SequenceNode):
            nodes += reversed(node.value)
    return StudyError(file, None, f"a value cannot be built ({str(err).splitlines()[0][:80]})")


def expanded_size(node: yaml.Node | None, memo: dict[int, int] | None = None) -> int:
    """Nodes of the document once every alias is expanded, computed without expanding them
    (a 400-byte "billion laughs" file expands to 10^9 nodes). An alias inside the value it
    names (`a: &p {b: *p}`) would expand forever: a YAMLError."""
    if node is None:
        return 0
    memo = {} if memo is None else memo
    key = id(node)
    if key in memo:
        if memo[key] == EXPANDING:
            mark = node.start_mark
            raise yaml.YAMLError(f"a YAML alias (*name) at line {mark.line + 1} refers to a value that holds it, so it "
                                 "would expand forever; write the value out")
        return memo[key]
    memo[key] = EXPANDING
    if isinstance(node, yaml.MappingNode):
        size = 1 + sum(expanded_size(k, memo) + expanded_size(v, memo) for k, v in node.value)
    elif isinstance(node, yaml.SequenceNode):
        size = 1 + sum(expanded_size(item, memo) for item in node.value)
    else:
        size = 1
    memo[key] = size
    return size


EXPANDING = -1  # expanded_size's mark of a node whose size is being computed


# ---- size limits ----------------------------------------------------------------------------

MAX_STUDY_BYTES = 16 * 2**20  # a study file is read up to this size (`validate /dev/zero` ends)

LIMITS = {  # environment variable -> default; the defaults refuse only the absurd
    "WORKBENCH_MAX_RUNS": 10_000,  # runs of one study (sweep points x seeds)
    "WORKBENCH_MAX_PARAMS": 20_000_000_000,  # estimated parameters of one model
    "WORKBENCH_MAX_ACTIVATION_BYTES": 2**40,  # estimated activation memory of one batch (1 TiB)
    "WORKBENCH_MAX_YAML_NODES": 100_000,  # nodes of a study file once its aliases are expanded
}


def limit(name: str) -> int:
    value = os.environ.get(name)
    if value is None:
        return LIMITS[name]
    try:
        return int(float(value))
    except ValueError:
        raise SpecError(name, f"expected a number, got {value!r}") from None


def suggest(name: str, choices: list[str] | None) -> str:
    hint = closest(name, choices or [])
    return f"; did you mean {hint!r}?" if hint else ""



def set_study_key(data: dict[str, Any], key: str, value: Any) -> None:
    """Set one override (a profile's or --set's): a dotted key of task, model or train; a
    top-level key such as `seeds`; or `sweep.<dotted key>` for a swept list, `scale.<dotted key>` for a
    ladder's list (its key keeps its dots)."""
    section = next((name for name in ("sweep", "scale") if key.startswith(name + ".")), None)
    if section is not None:
        lists = data.get(section)
        data[section] = {**(lists if isinstance(lists, Mapping) else {}), key.removeprefix(section + "."): value}
    elif "." in key:
        set_dotted(data, key, value)
    else:
        data[key] = value


def apply_profile(data: dict[str, Any], profile: str, file: str, lines: LineMap) -> dict[str, Any]:
    profiles = data.get("profiles") or {}
    if not isinstance(profiles, Mapping) or profile not in profiles:
        names = sorted(profiles) if isinstance(profiles, Mapping) else []
        raise StudyError(file, lines.line("profiles"),
                         SpecError("--profile", f"unknown profile {profile!r}" + suggest(profile, names), names))
    overrides = profiles[profile]
    if not isinstance(overrides, Mapping):
        raise StudyError(file, lines.line(f"profiles.{profile}"),
                         SpecError(f"profiles.{profile}", "expected a mapping {dotted.key: value}"))
    data = copy.deepcopy(data)
    for key, value in overrides.items():
        set_study_key(data, str(key), value)
        # An error in an overridden field points at the profile line that set it.
        lines.lines[str(key)] = lines.line(f"profiles.{profile}.{key}") or 0
    return data


def parse_override(text: str) -> tuple[str, Any]:
    """`train.steps=500` -> ("train.steps", 500): the value is read as YAML (safe), so lists,
    mappings and numbers are written as in a study file, under a study file's limits."""
    key, sep, value = text.partition("=")
    key = key.strip()
    if not sep or not key:
        raise SpecError("--set", f"expected KEY=VALUE (e.g. train.steps=500), got {text!r}")
    return key, parse_yaml(value, f"--set {key}", located=False)[0] if value.strip() else None


def apply_overrides(data: dict[str, Any], overrides: tuple[str, ...], file: str, lines: LineMap) -> dict[str, Any]:
    """`--set` on the command line: each KEY=VALUE edits the study as if the file said so
    (a dotted key of task, model or train; `seeds`; or `sweep.<dotted key>` for a swept list),
    so it changes the study hash exactly like the same edit of the file would."""
    data = copy.deepcopy(data)
    for text in overrides:
        try:
            key, value = parse_override(text)
        except SpecError as err:
            raise StudyError(file, None, err) from None
        before = data.get("sweep")
        set_study_key(data, key, value)
        lines.lines[key] = 0  # an error in an overridden field names the field, not a line of the file
        if key.startswith("sweep.") and isinstance(before, Mapping):
            leave_out_orphaned_claims(data, before, key.removeprefix("sweep."), text)
        swept = swept_under(data.get("sweep"), key)
        if swept is not None:
            warnings.warn(f"--set {text}: {swept} is swept, so the sweep's values replace this one in every run "
                          f"(and it is not checked); to change what is swept: --set 'sweep.{swept}=[a, b]'",
                          WorkbenchWarning, stacklevel=2)
    return data


def leave_out_orphaned_claims(data: dict[str, Any], before: Mapping[str, Any], swept: str, text: str) -> None:
    """After `--set sweep.KEY=[...]` narrowed a sweep: the `expect:` entries (and a `baseline:`)
    that name a value of KEY no longer swept have nothing to compare, so they are left out of
    this run's study, each named in a one-line warning (the file keeps them for the full sweep)."""
    old, new = before.get(swept), (data.get("sweep") or {}).get(swept)
    if not isinstance(old, list) or not isinstance(new, list):
        return
    gone = {canonical_json(label(v)) for v in old} - {canonical_json(label(v)) for v in new}
    if not gone:
        return
    sweep = data["sweep"]
    groups = sweep.get("zip", [])
    groups = [groups] if isinstance(groups, Mapping) else groups if isinstance(groups, list) else []
    keys = [k for k in sweep if k != "zip"] + [k for g in groups if isinstance(g, Mapping) for k in g]
    compared = [k for k in keys if k not in (data.get("scale") or {})]

    def dropped_value(point: Any) -> str | None:
        """The value of KEY the point names, when it is one no longer swept (as sweep_point reads a point)."""
        if isinstance(point, Mapping) and point and all(k in keys for k in point):
            if swept not in point:
                return None
            value = point[swept]
        elif compared == [swept]:
            value = point
        else:
            return None
        return f"{swept.rsplit('.', 1)[-1]}={label(value)}" if canonical_json(label(value)) in gone else None

    expect = data.get("expect")
    if isinstance(expect, list):
        kept = []
        for index, entry in enumerate(expect):
            names = [dropped_value(entry.get(side)) for side in ("better", "than")] if isinstance(entry, Mapping) else []
            orphan = next((n for n in names if n), None)
            if orphan is None:
                kept.append(entry)
                continue
            warnings.warn(f"--set {text}: expect.{index} ({point_text(entry.get('better'))} better than "
                          f"{point_text(entry.get('than'))} on "
                          f"{entry.get('metric')}) compares {orphan}, no longer swept: left out of this run's verdicts",
                          WorkbenchWarning, stacklevel=3)
        data["expect"] = kept
    orphan = dropped_value(data.get("baseline")) if data.get("baseline") is not None else None
    if orphan is not None:
        warnings.warn(f"--set {text}: the baseline {orphan} is no longer swept: this run's report has no deltas to "
                      "a baseline", WorkbenchWarning, stacklevel=3)
        data["baseline"] = None


def point_text(point: Any) -> str:
    """An `expect:` point as a study writes it: `4`, `{model.n_kv_heads: 4}`."""
    if isinstance(point, Mapping) and "name" not in point:
        return "{" + ", ".join(f"{k}: {label(v)}" for k, v in point.items()) + "}"
    return str(label(point))


def swept_under(sweep: Any, key: str) -> str | None:
    """The swept key that decides `key` in every run (the key itself, or a variant it belongs to:
    model.attention.window under a swept model.attention), or None."""
    if not isinstance(sweep, Mapping) or key.startswith("sweep."):
        return None
    groups = sweep.get("zip", [])
    groups = [groups] if isinstance(groups, Mapping) else groups if isinstance(groups, list) else []
    keys = [k for k in sweep if k != "zip"] + [k for g in groups if isinstance(g, Mapping) for k in g]
    return next((k for k in keys if key == k or key.startswith(f"{k}.")), None)
