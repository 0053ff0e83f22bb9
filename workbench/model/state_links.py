"""Links between two state dicts: each of our tensors made of one or more of theirs, and back.
The vocabulary workbench.model.hf writes its architectures' weight mappings in."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from workbench.model.spec import ModelSpec


@dataclass(frozen=True)
class Link:
    """Our tensor `ours` is `join(theirs...)`; `split(ours)` gives theirs back, in order."""

    ours: str
    theirs: tuple[str, ...]
    split: Callable[[Tensor], list[Tensor]]
    join: Callable[[list[Tensor]], Tensor]


def same(ours: str, theirs: str) -> Link:
    return Link(ours, (theirs,), lambda t: [t], lambda ts: ts[0])


def transposed(ours: str, theirs: str) -> Link:
    """GPT-2's Conv1D stores a linear layer's weight as [in, out]."""
    return Link(ours, (theirs,), lambda t: [t.T], lambda ts: ts[0].T)


def rows(ours: str, parts: list[tuple[str, int, Tensor | None]]) -> Link:
    """Ours stacks the rows of several tensors of theirs: (name, rows, order) each, where
    ours_part = theirs_part[order] (None: the same order)."""
    sizes = [n for _, n, _ in parts]
    orders = [order for _, _, order in parts]

    def split(t: Tensor) -> list[Tensor]:
        return [p if o is None else p[o.argsort()] for p, o in zip(t.split(sizes), orders)]

    def join(ts: list[Tensor]) -> Tensor:
        return torch.cat([p if o is None else p[o] for p, o in zip(ts, orders)])

    return Link(ours, tuple(name for name, _, _ in parts), split, join)


def linear(ours: str, theirs: str, bias: bool, link=same) -> list[Link]:
    return [link(f"{ours}.weight", f"{theirs}.weight")] + ([same(f"{ours}.bias", f"{theirs}.bias")] if bias else [])


def norm(ours: str, theirs: str, spec: ModelSpec, kind: str | None = None) -> list[Link]:
    """A LayerNorm has weight and bias, an RMSNorm a weight."""
    kind = kind or spec.norm.params.type
    return linear(ours, theirs, bias=kind == "layernorm")


def separate_qkv(ours: str, q: str, k: str, v: str, spec: ModelSpec, bias: bool,
                 order: tuple[Tensor | None, Tensor | None] = (None, None)) -> list[Link]:
    """Our fused [q; k; v] projection from three separate ones; `order`: q's and k's row orders."""
    h, g, hd = spec.n_heads, spec.n_kv_heads, spec.head_dim
    parts = [(q, h * hd, order[0]), (k, g * hd, order[1]), (v, g * hd, None)]
    links = [rows(f"{ours}.weight", [(f"{name}.weight", n, o) for name, n, o in parts])]
    if bias:
        links.append(rows(f"{ours}.bias", [(f"{name}.bias", n, o) for name, n, o in parts]))
    return links


def attention(ours: str, theirs: tuple[str, str, str, str], spec: ModelSpec, bias: bool,
              order: tuple[Tensor | None, Tensor | None] = (None, None)) -> list[Link]:
    """A self-attention layer: our qkv and out from their (q, k, v, out) projections."""
    q, k, v, out = theirs
    return separate_qkv(f"{ours}.qkv", q, k, v, spec, bias, order) + linear(f"{ours}.out", out, bias)


def mlp(ours: str, up: str, down: str, bias: bool) -> list[Link]:
    return linear(f"{ours}.up", up, bias) + linear(f"{ours}.down", down, bias)


def gated_mlp(ours: str, theirs: str, d_ff: int) -> list[Link]:
    """A gated FFN: our `gate_up` is [gate; up] = their [gate_proj; up_proj] (Llama's names)."""
    return [rows(f"{ours}.gate_up.weight", [(f"{theirs}.gate_proj.weight", d_ff, None),
                                            (f"{theirs}.up_proj.weight", d_ff, None)])] + \
        linear(f"{ours}.down", f"{theirs}.down_proj", False)


def cross_kv(ours: str, k: str, v: str, spec: ModelSpec, bias: bool) -> list[Link]:
    n = spec.n_kv_heads * spec.head_dim
    links = [rows(f"{ours}.weight", [(f"{k}.weight", n, None), (f"{v}.weight", n, None)])]
    return links + ([rows(f"{ours}.bias", [(f"{k}.bias", n, None), (f"{v}.bias", n, None)])] if bias else [])


def check_coverage(links: list[Link], ours: dict[str, Tensor], theirs: dict[str, Tensor], what: str,
                   unmapped: tuple[str, ...] = ()) -> None:
    """Every parameter on both sides (but theirs starting with an `unmapped` prefix) is linked
    exactly once: a mapping that misses one is a bug."""
    theirs = {name: t for name, t in theirs.items() if not name.startswith(unmapped)}
    linked_ours = [link.ours for link in links]
    linked_theirs = [name for link in links for name in link.theirs]
    for side, linked, params in (("ours", linked_ours, ours), (what, linked_theirs, theirs)):
        missing, unknown = set(params) - set(linked), set(linked) - set(params)
        if missing or unknown or len(linked) != len(set(linked)):
            raise AssertionError(f"{what} mapping, {side}: unlinked {sorted(missing)}, unknown {sorted(unknown)}")
