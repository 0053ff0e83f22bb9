"""sort: sort a random symbol string by symbol id (duplicates kept)."""

from workbench import hookimpl
from workbench.tasks import SymbolTask


class Sort(SymbolTask):
    """Sort a random symbol string (alphabet order, duplicates kept)."""

    name = "sort"

    def transform(self, symbols: list[int]) -> list[int]:
        return sorted(symbols)


@hookimpl
def register_tasks():
    return [Sort]
