"""classify: ListOps (Nangia & Bowman 2018, as generated for the Long Range Arena).

A nested list of operators over digits, e.g. `[MAX 2 9 [MIN 4 7 ] 0 ]` -> 9. Operators:
MAX, MIN, MED (median, rounded down), SM (sum modulo 10). The label (0-9) needs the whole
expression, so a sequence classifier must route information across the full input. The
generator follows LRA's: the root is an operator; below it a node is an operator with
probability `op_probability` until `max_depth`, otherwise a digit; an operator takes
2..max_args arguments. Examples are rejection-sampled by token count.

Families: encoder (mean-pooled classification head, n_classes = 10) and decoder
(`<bos> expression <sep> label`, the label token the only scored token).
"""

from __future__ import annotations

from pydantic import Field

from workbench import hookimpl
from workbench.tasks import Example, LengthRangeParams, Task, declared, draw_within, length_window

OPERATORS = ("[MAX", "[MIN", "[MED", "[SM")
END = "]"
DIGITS = tuple(str(d) for d in range(10))


def apply(op: str, args: list[int]) -> int:
    if op == "[MAX":
        return max(args)
    if op == "[MIN":
        return min(args)
    if op == "[MED":
        ordered = sorted(args)
        mid = len(ordered) // 2
        return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) // 2
    if op == "[SM":
        return sum(args) % 10
    raise ValueError(f"unknown ListOps operator {op!r}")


def random_tree(rng, depth: int, max_depth: int, max_args: int, op_probability: float) -> tuple[list[str], int]:
    """Tokens and value of a random subtree."""
    if depth == 1 or (depth < max_depth and rng.random() < op_probability):
        op = OPERATORS[int(rng.integers(len(OPERATORS)))]
        tokens, values = [op], []
        for _ in range(int(rng.integers(2, max_args + 1))):
            sub_tokens, sub_value = random_tree(rng, depth + 1, max_depth, max_args, op_probability)
            tokens += sub_tokens
            values.append(sub_value)
        return tokens + [END], apply(op, values)
    digit = int(rng.integers(10))
    return [DIGITS[digit]], digit


class ListOpsParams(LengthRangeParams):
    train_length: int = Field(48, gt=2, description="longest training expression in tokens")
    min_length: int = Field(8, gt=2, description="shortest training expression in tokens")
    max_depth: int = Field(3, ge=2, description="deepest nesting (the root is depth 1)")
    max_args: int = Field(4, ge=2, description="most arguments of one operator")
    op_probability: float = Field(0.25, ge=0, le=1, description="chance that a non-root node is an operator")


class ListOps(Task):
    """ListOps: evaluate nested MAX/MIN/MED/SM lists to a digit (10 classes)."""

    name = "classify"
    Params = ListOpsParams
    families = ("encoder", "decoder")
    metrics = declared("accuracy")
    sequence_labels = True
    decoder_eos = False  # the label token is the whole answer

    def __init__(self, params: ListOpsParams, **kw):
        super().__init__(params, **kw)
        self._set_vocab([*OPERATORS, END, *DIGITS])
        self.first_digit = self.token_id["0"]

    def example(self, rng, length, training):
        p = self.params
        lo, hi = length_window(length, p.train_length, p.min_length, training)
        tokens, value = draw_within(
            lambda: random_tree(rng, 1, p.max_depth, p.max_args, p.op_probability),
            lambda tree: len(tree[0]), lo, hi, f"task classify (max_depth={p.max_depth}, max_args={p.max_args})",
        )
        return Example(self.encode(tokens), (self.first_digit + value,))

    def class_of(self, ex: Example) -> int:
        return ex.target[0] - self.first_digit

    def model_overrides(self, family):
        overrides = super().model_overrides(family)
        if family == "encoder":
            overrides["n_classes"] = len(DIGITS)
        return overrides


@hookimpl
def register_tasks():
    return [ListOps]
