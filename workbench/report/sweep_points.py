"""Variants of a study: the distinct points of its sweep, their labels, and which variant a
`baseline:` or `expect:` point denotes for each other.

A run's variant is its values on the swept keys (seeds aside). Its label names each key by
its last part with its value (`position=alibi`, `n_kv_heads=4`, `position=alibi, norm=pre`),
so a verdict line or a legend says what was varied, not only a bare `4`. A point such as `{model.position: sinusoidal}` fixes some keys;
a variant's counterpart under that point is the variant with those keys replaced and every
other swept key unchanged, so with position x depth swept, "alibi beats sinusoidal" is
checked at each depth separately instead of pooling depths.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import pandas as pd

from workbench.study.keys import label


def short_key(key: str) -> str:
    """model.position -> position; task.train_length -> train_length."""
    return key.rsplit(".", 1)[-1]


def value_text(value: Any) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "None"  # a swept null (e.g. top_p: null) reads back from the results table as NaN
    return str(label(value))


def value_texts(column: pd.Series, swept: Sequence[Any] = ()) -> list[str]:
    """`value_text` of every value of a results column, each distinct value converted once. A number
    equal to a swept value reads as the sweep writes it: a swept key holding null beside integers
    (`n_kv_heads: [2, null]`) comes back from the results table as floats (2.0, NaN)."""
    as_swept = {float(s): value_text(s) for s in swept if isinstance(s, (int, float)) and not isinstance(s, bool)}
    texts = {}

    def text(v: Any) -> str:
        return as_swept[v] if isinstance(v, float) and v in as_swept else value_text(v)

    return [texts[v] if v in texts else texts.setdefault(v, text(v)) for v in column.tolist()]


@dataclass(frozen=True)
class Variants:
    """The swept keys and, in sweep order, every variant's values on them."""

    keys: tuple[str, ...]
    points: tuple[tuple[str, ...], ...]  # one tuple of value texts per variant, in `keys` order
    swept: Mapping[str, Sequence[Any]] = field(default_factory=dict, compare=False)  # each key's swept values, as the sweep writes them

    @classmethod
    def of(cls, keys: Sequence[str], runs: pd.DataFrame, swept_values: Mapping[str, Sequence[Any]] | None = None) -> Variants:
        """Variants present in `runs`, ordered as the sweep lists the values (then by text)."""
        keys = tuple(keys)
        order = {k: [value_text(v) for v in (swept_values or {}).get(k, [])] for k in keys}

        def rank(point: tuple[str, ...]) -> tuple:
            return tuple((order[k].index(v) if v in order[k] else len(order[k]), v) for k, v in zip(keys, point))

        swept = {k: tuple((swept_values or {}).get(k, ())) for k in keys}
        present = set(zip(*(value_texts(runs[k], swept[k]) for k in keys))) if keys else {()}
        return cls(keys, tuple(sorted(present, key=rank)), swept)

    def label(self, point: Sequence[str]) -> str:
        if not self.keys:
            return "all runs"
        return ", ".join(f"{short_key(k)}={v}" for k, v in zip(self.keys, point))

    @cached_property
    def labels(self) -> list[str]:
        return [self.label(p) for p in self.points]

    def label_runs(self, runs: pd.DataFrame) -> pd.Series:
        """The variant label of every run (row)."""
        if runs.empty:
            return pd.Series([], dtype=str, index=runs.index)
        if not self.keys:
            return pd.Series(self.label(()), index=runs.index, dtype=object)
        texts = list(zip(*(value_texts(runs[k], self.swept.get(k, ())) for k in self.keys)))
        labels = {point: self.label(point) for point in set(texts)}
        return pd.Series([labels[point] for point in texts], index=runs.index, dtype=object)

    def values(self, variant: str) -> dict[str, str]:
        """{swept key: value text} of the variant labelled `variant`."""
        return dict(zip(self.keys, self.points[self.labels.index(variant)]))

    def counterpart(self, variant: str, point: Mapping[str, Any]) -> str | None:
        """The variant equal to `variant` except on the keys `point` fixes; None if not run."""
        values = self.values(variant)
        values.update({k: value_text(v) for k, v in point.items()})
        target = tuple(values[k] for k in self.keys)
        return self.label(target) if target in self.points else None

    def matching(self, point: Mapping[str, Any]) -> list[str]:
        """Variants whose values agree with `point` on the keys it fixes."""
        fixed = {k: value_text(v) for k, v in point.items()}
        return [self.label(p) for p in self.points if all(dict(zip(self.keys, p))[k] == v for k, v in fixed.items())]

    def pairs(self, better: Mapping[str, Any], than: Mapping[str, Any]) -> list[tuple[str, str]]:
        """(A, B) for each variant A matching `better` whose counterpart under `than` was run."""
        out = []
        for a in self.matching(better):
            b = self.counterpart(a, than)
            if b is not None and b != a:
                out.append((a, b))
        return out
