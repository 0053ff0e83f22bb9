"""`workbench new-plugin AXIS NAME`: a pip-installable plugin package to start from.

    workbench-NAME/
        pyproject.toml              the `workbench` entry point (how the workbench finds it)
        workbench_NAME.py           Params (typed, documented) + the variant + its hook
        tests/test_workbench_NAME.py
        README.md

Each axis gets a small *working* variant named after a reference (a scaled sinusoidal
encoding, attention with a softmax temperature, Pre-Norm with a second norm on the residual
sum, a two-layer MLP with a choice of activation, a fixed residual scaling, a shifted-copy symbol
task, SGD with Nesterov momentum), so the package passes
its own tests and the workbench's contract tests as generated; the user then replaces the
body with their idea, keeping the interface.
"""

from __future__ import annotations

import json
import re
import textwrap
from pathlib import Path

from workbench.errors import SpecError, WorkbenchError
from workbench.registry import HOOK_OF_AXIS, NOUN_OF_AXIS, variants
from workbench.variants import AXES

NAME = re.compile(r"^[a-z][a-z0-9_]*$")
# What a generated package's tests and the workbench's contract tests (tests/test_model_contract.py,
# run against the plugin) import beyond the workbench itself: the package's `[test]` extra.
CONTRACT_TEST_REQUIREMENTS = ("pytest>=8", "hypothesis>=6.100")

# Per axis: imports, the Params class body, the variant class body (after `name`/`Params`).
BODIES = {
    "position": ('''\
import torch
from pydantic import Field
from torch import Tensor

from workbench.model.position import INIT_STD, PositionScheme
from workbench.variants import Params
''', '''\
    scale: float = Field(INIT_STD, gt=0, description="multiplies the encoding added to the embeddings; the "
                         "token embeddings' init std keeps both at comparable RMS")
    base: float = Field(10000.0, gt=1, description="wavelength scale of the slowest dimension")
''', '''\
    def embed(self, x: Tensor, pos: Tensor) -> Tensor:
        """x: [B, n, d_model], pos: [B, n] -> x + scale * PE(pos) (Vaswani et al. 2017).
        Other hooks of PositionScheme: rotate(q, k, q_pos, k_pos) and score_bias(rel)."""
        i = torch.arange(0, self.d_model, 2, device=pos.device, dtype=torch.float32)  # the 2i of the formula
        angles = pos[..., None].float() / self.params.base ** (i / self.d_model)  # [B, n, ceil(d/2)]
        table = torch.zeros(*pos.shape, self.d_model, device=pos.device)
        table[..., 0::2] = torch.sin(angles)
        table[..., 1::2] = torch.cos(angles[..., : self.d_model // 2])
        return x + self.params.scale * table.to(x.dtype)
''', "Sinusoidal encoding (Vaswani et al. 2017) times a fixed scale, added to the embeddings."),
    "attention": ('''\
from pydantic import Field

from workbench.model.attention import AttentionParams, AttentionVariant
''', '''\
    temperature: float = Field(1.0, gt=0, description="divides the scores before the softmax (1: standard attention)")
''', '''\
    def __init__(self, params, **dims):
        super().__init__(params, **dims)
        self.scale = self.scale / params.temperature  # used by dense(), the explicit-scores path

    # forward() defaults to self.dense(...): explicit [B, h, nq, nk] scores masked by
    # allowed(q_pos, k_pos, causal). Override allowed() to change which keys a query reads,
    # and forward() for a fast path.
''', "Softmax attention over every allowed key, with a temperature on the scores."),
    "norm": ('''\
from pydantic import Field
from torch import Tensor, nn

from workbench.model.norm import NormParams, NormPlacement, make_norm
''', '''\
    sum_norm: bool = Field(True, description="also normalise the residual sum after the add (false: Pre-Norm)")
''', '''\
    final_norm = True  # the stack ends with a norm before the output head, as in Pre-Norm

    def __init__(self, params, *, d_model: int):
        super().__init__(params, d_model=d_model)
        self.sum_norm = make_norm(params, d_model) if params.sum_norm else nn.Identity()

    # Block.forward does the residual add: x = after(x + f(before(x))), both the identity by default.
    def before(self, x: Tensor) -> Tensor:
        """What the sublayer reads: norm(x), as in Pre-Norm."""
        return self.norm(x)

    def after(self, x: Tensor) -> Tensor:
        """The residual sum x + f(norm(x)), normalised again when sum_norm is set."""
        return self.sum_norm(x)
''', "Pre-Norm with an optional second norm on the residual sum (Pre- and Post-Norm at once)."),
    "ffn": ('''\
from typing import Literal

from pydantic import Field
from torch import Tensor, nn

from workbench.model.ffn import FeedForward, FFNParams
''', '''\
    activation: Literal["relu", "gelu", "silu"] = Field("gelu", description="nonlinearity between the two layers")
''', '''\
    def __init__(self, params, *, d_model: int, bias: bool):
        super().__init__(params, d_model=d_model, bias=bias)
        d_ff = params.d_ff or 4 * d_model
        self.up = nn.Linear(d_model, d_ff, bias=bias)
        self.act = {"relu": nn.ReLU, "gelu": nn.GELU, "silu": nn.SiLU}[params.activation]()
        self.down = nn.Linear(d_ff, d_model, bias=bias)

    def forward(self, x: Tensor) -> Tensor:
        return self.down(self.act(self.up(x)))  # [B, n, d_model]
''', "Two-layer MLP, W2 act(W1 x), with a choice of activation."),
    "residual": ('''\
from pydantic import Field
from torch import Tensor

from workbench.model.residual import Residual
from workbench.variants import Params
''', '''\
    scale: float = Field(0.2, gt=0, description="multiplies each sublayer's output before the add (1: plain x + f(x))")
''', '''\
    # Block.forward joins each sublayer's output y to the stream x as skip(x) + branch(y), both the
    # identity by default; init_branch(sublayer) may re-scale the sublayer's initial weights.
    def branch(self, y: Tensor) -> Tensor:
        """The sublayer's output [B, n, d_model], scaled before it joins the stream."""
        return self.params.scale * y
''', "Residual scaling (Szegedy et al. 2017, Inception-v4): x + scale * f(x) with a fixed scale."),
    "task": ('''\
from pydantic import Field

from workbench.tasks import SymbolParams, SymbolTask
''', '''\
    shift: int = Field(1, ge=0, description="added to each symbol, modulo the alphabet (0: plain copy)")
''', '''\
    def transform(self, symbols: list[int]) -> list[int]:
        """The target of a random symbol string (ids from self.first_symbol on)."""
        a, first = self.params.alphabet_size, self.first_symbol
        return [first + (s - first + self.params.shift) % a for s in symbols]
''', "Copy a random symbol string with every symbol shifted along the alphabet (a Caesar cipher)."),
    "optimizer": ('''\
import torch
from pydantic import Field

from workbench.model.optimizers import Optimizer, decay_groups
from workbench.variants import Params
''', '''\
    momentum: float = Field(0.9, ge=0, lt=1, description="momentum factor of the gradient average")
''', '''\
    def build(self, model, *, lr: float, weight_decay: float) -> torch.optim.Optimizer:
        """A torch optimizer over the model's parameters: train.lr and train.weight_decay apply,
        the run's schedule scales every group's lr. decay_groups: decay on matrices only."""
        groups = decay_groups(list(model.parameters()), weight_decay)
        return torch.optim.SGD(groups, lr=lr, momentum=self.params.momentum, nesterov=True)
''', "SGD with Nesterov momentum (Sutskever et al. 2013), weight decay on matrices only."),
}
PARAMS_BASE = {"position": "Params", "attention": "AttentionParams", "norm": "NormParams", "ffn": "FFNParams",
               "residual": "Params", "task": "SymbolParams", "optimizer": "Params"}
BASE_CLASS = {"position": "PositionScheme", "attention": "AttentionVariant", "norm": "NormPlacement",
              "ffn": "FeedForward", "residual": "Residual", "task": "SymbolTask", "optimizer": "Optimizer"}

MODEL_TEST = '''\


def test_a_model_with_it_trains_one_step():
    model = build_model({{"vocab_size": 16, "d_model": 16, "n_heads": 2, "n_layers": 1, "{axis}": "{name}"}})
    tokens = torch.randint(0, 16, (2, 9))
    loss = model(tokens).logsumexp(-1).mean()
    loss.backward()
    assert torch.isfinite(loss) and all(p.grad is not None for p in model.parameters())
'''
TASK_TEST = '''\


def test_its_batches_train_a_model_one_step():
    cls = get_variant("task", "{name}")
    task = cls(cls.Params(), seed=0)
    batch = task.train_batch(0, 4, "decoder")
    model = build_model({{"d_model": 16, "n_heads": 2, "n_layers": 1, **task.model_overrides("decoder")}})
    loss = task.loss(model, batch, "decoder")
    loss.backward()
    assert torch.isfinite(loss)
'''

OPTIMIZER_TEST = '''\


def test_it_steps_a_model():
    cls = get_variant("optimizer", "{name}")
    model = build_model({{"vocab_size": 16, "d_model": 16, "n_heads": 2, "n_layers": 1}})
    optimizer = cls(cls.Params()).build(model, lr=0.01, weight_decay=0.01)
    before = [p.detach().clone() for p in model.parameters()]
    model(torch.randint(0, 16, (2, 9))).logsumexp(-1).mean().backward()
    optimizer.step()
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters()))
'''


def camel(name: str) -> str:
    return "".join(part.capitalize() for part in name.split("_"))


def module_text(axis: str, name: str) -> str:
    imports, params, body, summary = BODIES[axis]
    cls = camel(name)
    return f'''"""{name}: a {NOUN_OF_AXIS[axis]} for Transformer Workbench.

Generated by `workbench new-plugin {axis} {name}` as a working starting point: {summary[0].lower() + summary[1:]}
Replace the body with your idea and keep the interface; document the reference you follow
and how yours deviates from it.
"""

{imports.replace("from workbench.", "from workbench import hookimpl" + chr(10) + "from workbench.", 1)}

class {cls}Params({PARAMS_BASE[axis]}):
    """Parameters of `{name}`: a study sets them as `{{name: {name}, <param>: <value>}}`; the
    descriptions are shown by `workbench list {axis}`."""

{params}

class {cls}({BASE_CLASS[axis]}):
    """{summary}"""

    name = "{name}"
    Params = {cls}Params

{body}

@hookimpl
def {HOOK_OF_AXIS[axis]}():
    return [{cls}]
'''


def test_text(axis: str, name: str, module: str) -> str:
    extra = {"task": TASK_TEST, "optimizer": OPTIMIZER_TEST}.get(axis, MODEL_TEST)
    return f'''"""Tests of the `{name}` {NOUN_OF_AXIS[axis]}: registered through the package's entry point,
parameters validated, and usable end to end. The workbench's contract tests cover the rest:
`python -m pytest PATH/TO/transformer-workbench/tests/test_model_contract.py -k {name}`."""

import pytest
import torch

from workbench import build_model
from workbench.registry import get_variant


def test_registered_under_its_name():
    assert get_variant("{axis}", "{name}").__module__ == "{module}"


def test_parameters_are_validated():
    cls = get_variant("{axis}", "{name}")
    cls.Params()  # every parameter has a default
    with pytest.raises(ValueError):
        cls.Params(no_such_parameter=1)
{extra.format(axis=axis, name=name)}'''


def pyproject_text(name: str, module: str, dist: str) -> str:
    return f'''[build-system]
requires = ["setuptools>=77"]
build-backend = "setuptools.build_meta"

[project]
name = "{dist}"
version = "0.1.0"
description = "The {name} variant for Transformer Workbench"
requires-python = ">=3.11"
dependencies = ["transformer-workbench"]

[project.optional-dependencies]
test = {json.dumps(list(CONTRACT_TEST_REQUIREMENTS))}

[tool.setuptools]
py-modules = ["{module}"]

# How the workbench finds the plugin: one entry point in the `workbench` group.
[project.entry-points.workbench]
{name} = "{module}"
'''


def readme_text(axis: str, name: str, dist: str) -> str:
    return textwrap.dedent(f"""\
        # {dist}

        The `{name}` {NOUN_OF_AXIS[axis]} for Transformer Workbench.

        ```bash
        pip install -e '.[test]'     # then `workbench list {axis}` shows {name}; [test] brings pytest and hypothesis
        python -m pytest tests       # this package's tests
        ```

        In a study: `{study_line(axis, name)}`.
        """)


def study_line(axis: str, name: str) -> str:
    if axis == "task":
        return f"task: {{name: {name}}}"
    if axis == "optimizer":
        return f"train: {{optimizer: {name}}}"
    return f"model: {{{axis}: {name}}}"


def new_plugin(axis: str, name: str, parent: str | Path = ".") -> Path:
    """Write the package folder workbench-NAME/ under `parent`; returns its path."""
    if axis not in AXES:
        raise SpecError("AXIS", f"unknown axis {axis!r}", AXES)
    if not NAME.match(name):
        raise SpecError("NAME", f"{name!r} is not a valid variant name: lowercase letters, digits and '_', "
                                "starting with a letter")
    if name in variants(axis):
        raise WorkbenchError(f"NAME: {name!r} is already a registered {NOUN_OF_AXIS[axis]}; a plugin reusing it "
                             "would replace it: choose another name")
    module, dist = f"workbench_{name}", f"workbench-{name.replace('_', '-')}"
    root = Path(parent) / dist
    if root.exists():
        raise WorkbenchError(f"{root} already exists: choose another name or folder")
    (root / "tests").mkdir(parents=True)
    (root / f"{module}.py").write_text(module_text(axis, name), encoding="utf-8")
    (root / "tests" / f"test_{module}.py").write_text(test_text(axis, name, module), encoding="utf-8")
    (root / "pyproject.toml").write_text(pyproject_text(name, module, dist), encoding="utf-8")
    (root / "README.md").write_text(readme_text(axis, name, dist), encoding="utf-8")
    return root
