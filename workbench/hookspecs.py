"""Plugin hooks. A plugin module implements any of these with `@workbench.hookimpl`
and is declared as an entry point in the `workbench` group of its package."""

from __future__ import annotations

import pluggy

hookspec = pluggy.HookspecMarker("workbench")
hookimpl = pluggy.HookimplMarker("workbench")


@hookspec
def register_position_schemes() -> list[type]:
    """Return PositionScheme subclasses (how tokens learn where they are)."""


@hookspec
def register_attention_variants() -> list[type]:
    """Return AttentionVariant subclasses (which positions each query reads, and how)."""


@hookspec
def register_norm_placements() -> list[type]:
    """Return NormPlacement subclasses (where the norm sits around each residual branch)."""


@hookspec
def register_ffn_types() -> list[type]:
    """Return FeedForward subclasses (the per-token sublayer of each block)."""


@hookspec
def register_residual_connections() -> list[type]:
    """Return Residual subclasses (how each sublayer's output joins the residual stream)."""


@hookspec
def register_tasks() -> list[type]:
    """Return Task subclasses (data, vocabulary and metrics for a study)."""


@hookspec
def register_optimizers() -> list[type]:
    """Return Optimizer subclasses (what `train.optimizer` names: the optimizer and its parameter groups)."""


@hookspec
def register_study_kinds() -> list[type]:
    """Return StudyKind subclasses (what a study's `kind:` selects: validate, run, report)."""
