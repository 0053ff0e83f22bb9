"""Six modifications of 2024-2026 as Transformer Workbench plugins, one module each."""
