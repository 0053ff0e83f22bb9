"""The `workbench` command. User mistakes print one message and exit 2, never a traceback."""

from __future__ import annotations

import json
import sys

import click
from rich.console import Console
from rich.table import Table

from workbench.errors import WorkbenchError
from workbench.registry import NOUN_OF_AXIS, distribution_of, variants
from workbench.variants import AXES


class WorkbenchGroup(click.Group):
    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except WorkbenchError as err:
            click.echo(f"error: {err}", err=True)
            sys.exit(2)


@click.group(cls=WorkbenchGroup)
@click.version_option(package_name="transformer-workbench")
def main() -> None:
    """Declare studies of Transformer design choices, run them, read the reports."""


def variant_rows(axis: str) -> list[dict]:
    return [
        {
            "axis": axis,
            "name": name,
            "summary": cls.summary(),
            "package": distribution_of(cls),
            "parameters": cls.parameters(),
        }
        for name, cls in variants(axis).items()
    ]


@main.command("list")
@click.argument("axis", required=False, type=click.Choice(AXES))
@click.option("--json", "as_json", is_flag=True, help="machine-readable output")
def list_variants(axis: str | None, as_json: bool) -> None:
    """Every registered variant by axis, with its parameters and the package it comes from."""
    rows = [row for a in ([axis] if axis else AXES) for row in variant_rows(a)]
    if as_json:
        click.echo(json.dumps(rows, indent=2, default=str))
        return
    console = Console()
    for a in [axis] if axis else AXES:
        table = Table(title=f"{NOUN_OF_AXIS[a]}s ({a})", title_justify="left")
        for column in ("name", "parameters (type = default)", "description", "package"):
            table.add_column(column)
        for row in (r for r in rows if r["axis"] == a):
            params = "\n".join(
                f"{p['name']}: {p['type']} = {'required' if p['required'] else p['default']!r}  {p['help']}"
                for p in row["parameters"]
            )
            table.add_row(row["name"], params or "-", row["summary"], row["package"])
        console.print(table)


if __name__ == "__main__":
    main()
