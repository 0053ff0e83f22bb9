"""Transformer Workbench: compare Transformer design choices with declared studies."""

from workbench.hookspecs import hookimpl

__version__ = "0.1.0"

__all__ = ["build_model", "hookimpl", "__version__"]


def __getattr__(name: str):
    if name == "build_model":
        # torch loads with the model, on first use: `workbench` installs its stop handler before
        # that (a Ctrl-C during start-up is a clean stop, workbench.stopping)
        from workbench.model.transformer import build_model

        return build_model
    raise AttributeError(f"module 'workbench' has no attribute {name!r}")
