"""NoPE: no position signal. An encoder becomes permutation-equivariant; a causal decoder can
still infer order from the mask."""

from workbench import hookimpl
from workbench.model.position import PositionScheme


class NoPosition(PositionScheme):
    """No position information (NoPE)."""

    name = "none"


@hookimpl
def register_position_schemes():
    return [NoPosition]
