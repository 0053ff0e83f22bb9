"""reverse: write a random symbol string backwards."""

from workbench import hookimpl
from workbench.tasks import SymbolTask


class Reverse(SymbolTask):
    """Reverse a random symbol string."""

    name = "reverse"

    order_blind = True  # knowing the symbols without their order already gets some right

    def transform(self, symbols: list[int]) -> list[int]:
        return symbols[::-1]


@hookimpl
def register_tasks():
    return [Reverse]
