"""copy: reproduce a random symbol string."""

from workbench import hookimpl
from workbench.tasks import SymbolTask


class Copy(SymbolTask):
    """Copy a random symbol string (target = source)."""

    name = "copy"
    families = ("decoder", "encoder_decoder")

    def transform(self, symbols: list[int]) -> list[int]:
        return list(symbols)


@hookimpl
def register_tasks():
    return [Copy]
