"""copy: reproduce a random symbol string."""

from workbench import hookimpl
from workbench.tasks import SymbolTask


class Copy(SymbolTask):
    """Copy a random symbol string (target = source)."""

    name = "copy"
    families = ("decoder", "encoder_decoder")

    order_blind = True  # knowing the symbols without their order already gets some right

    def transform(self, symbols: list[int]) -> list[int]:
        return list(symbols)


@hookimpl
def register_tasks():
    return [Copy]
