"""Transformer Workbench: compare Transformer design choices with declared studies."""

from workbench.hookspecs import hookimpl

__version__ = "0.1.0"

__all__ = ["build_model", "from_hf", "hookimpl", "__version__"]


def __getattr__(name: str):
    if name == "build_model":
        # torch loads with the model, on first use: `workbench` installs its stop handler before
        # that (a Ctrl-C during start-up is a clean stop, workbench.stopping)
        from workbench.model.transformer import build_model

        return build_model
    if name == "from_hf":
        from workbench.model.hf import from_hf  # a transformers model -> ours; torch on first use, as above

        return from_hf
    raise AttributeError(f"module 'workbench' has no attribute {name!r}")
