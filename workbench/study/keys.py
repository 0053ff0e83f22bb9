"""Dotted keys (`model.attention.window`) into nested study data, value labels, and hashing
(run ids and study hashes are digests of canonical JSON)."""

from __future__ import annotations

import copy
import hashlib
import json
import re
from collections.abc import Mapping
from typing import Any

from workbench.model.spec import is_pattern, pattern_label, variant_label


def get_dotted(data: Mapping[str, Any], key: str) -> Any:
    node: Any = data
    for part in key.split("."):
        node = node[part]
    return node


def set_dotted(data: dict[str, Any], key: str, value: Any) -> None:
    """data[a][b][c] = value for key "a.b.c"; a variant given by name becomes {name: ...} when a
    parameter below it is set (model.attention.window on `attention: sliding_window`)."""
    *parents, last = key.split(".")
    node = data
    for part in parents:
        child = node.get(part)
        if isinstance(child, str):
            child = {"name": child}
        elif not isinstance(child, dict):
            child = {}
        node[part] = child
        node = child
    node[last] = copy.deepcopy(value)


def label(value: Any) -> Any:
    """A swept value as one flat column entry: scalars as they are, a variant mapping as
    `name(param=value, ...)`, a per-layer pattern of variants as `[a*3, b]` or `repeat[a*3, b]`
    (runs of one variant collapsed), anything else as compact JSON."""
    if isinstance(value, Mapping) and "name" in value:
        return variant_label(value)
    if is_pattern(value):
        return pattern_label(value)
    if isinstance(value, (Mapping, list)):
        return json.dumps(value, sort_keys=True)
    return value


def value_variant(value: Any) -> str | None:
    """The variant name of a swept value: `layerscale` for {name: layerscale, init_scale: 0.1}
    (or its label `layerscale(init_scale=0.1)`); None for a value that names no variant."""
    if isinstance(value, Mapping):
        return str(value["name"]) if "name" in value else None
    if isinstance(value, str):
        return re.fullmatch(r"([^()]+?)(\(.*\))?", value).group(1) if value else None
    return None


def split_top(text: str, sep: str) -> list[str]:
    """`text` split at each `sep` outside brackets, each part stripped: a label such as
    `layerscale(a=1, b=2)` or a JSON list stays whole (a group label "n_heads=1, position=rope"
    splits into its keys)."""
    parts, depth, current = [], 0, ""
    for ch in text:
        depth += (ch in "([{") - (ch in ")]}")
        if ch == sep and depth == 0:
            parts.append(current.strip())
            current = ""
        else:
            current += ch
    return [*parts, current.strip()]


def point_labels(point: Mapping[str, Any]) -> dict[str, Any]:
    """A sweep point ({dotted.key: value}, e.g. an `expect:` entry's) with each value as its
    label: JSON-safe, and equal for equal variants however they were written."""
    return {key: label(value) for key, value in point.items()}


def canonical_json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), default=str)


def digest(value: Any, n: int = 12) -> str:
    return hashlib.sha256(canonical_json(value).encode()).hexdigest()[:n]


HYDRA_STYLE = re.compile(r"^(?P<key>(?:task|model|train|sweep|seeds)(?:\.[\w.]+)?)=(?P<value>.*)$")


def hydra_hint(args: list[str]) -> str:
    """For `train.steps=5` (Hydra's habit) among the arguments: the workbench's own form,
    `--set train.steps=5`; `sweep.k=a,b` becomes `--set 'sweep.k=[a, b]'`. Empty otherwise."""
    for arg in args:
        match = HYDRA_STYLE.match(arg)
        if match is None:
            continue
        key, value = match["key"], match["value"]
        if key.startswith("sweep.") and "," in value and not value.startswith("["):
            return f"; did you mean `--set '{key}=[{', '.join(v.strip() for v in value.split(','))}]'`?"
        quoted = f"'{arg}'" if any(c in arg for c in " {}[],*") else arg
        return f"; did you mean `--set {quoted}`?"
    return ""
