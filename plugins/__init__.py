"""Built-in variants, installed as `workbench_plugins`: one module per variant, each declared
as an entry point in pyproject.toml exactly as a third-party plugin would be."""
