"""Transformer Workbench: compare Transformer design choices with declared studies."""

from workbench.hookspecs import hookimpl
from workbench.model import build_model

__version__ = "0.1.0"

__all__ = ["build_model", "hookimpl", "__version__"]
