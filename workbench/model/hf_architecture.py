"""What every Hugging Face architecture of workbench.model.hf holds: the requirements a spec must
meet, the config both ways and the weight links (workbench.model.state_links), as one class each
(workbench.model.hf_decoders, workbench.model.hf_encoders); and the helpers they share."""

from __future__ import annotations

from typing import Any

from workbench.errors import SpecError, WorkbenchError
from workbench.model.spec import ModelSpec
from workbench.model.state_links import Link

# The ids of the tasks' special tokens (workbench.tasks.tokens.SPECIALS: <pad>, <bos>, <eos>, <sep>),
# declared in every exported config so that transformers pads, starts and stops with them.
SPECIAL_IDS = dict(pad_token_id=0, bos_token_id=1, eos_token_id=2)


def import_transformers():
    try:
        import transformers
    except ImportError:
        raise WorkbenchError("Hugging Face export and import need transformers: pip install 'transformers>=5,<6'") from None
    return transformers


def value_at(spec: ModelSpec, field: str) -> Any:
    """'norm.type' -> spec.norm.params.type; 'norm.name' -> spec.norm.name; 'bias' -> spec.bias."""
    axis, _, key = field.partition(".")
    value = getattr(spec, axis)
    if not key:
        return value
    return value.name if key == "name" else getattr(value.params, key)


class Architecture:
    """One HF architecture: what a spec must hold, the config both ways, the weight links."""

    model_type: str
    hf_class: str  # the transformers class export writes and from_hf reads
    auto_class: str  # the transformers Auto class that loads an export
    unmapped: tuple[str, ...] = ()  # prefixes of their parameters outside what ours computes (left out)
    build_kwargs: dict[str, Any] = {}  # for hf_class(config, ...) in an export
    any_head_dim = False  # HF derives head_dim = d_model / n_heads (True: the config holds its own)

    def requirements(self, spec: ModelSpec) -> dict[str, Any]:
        """Dotted spec field -> the value the architecture needs, in the order they are checked."""
        raise NotImplementedError

    def config(self, spec: ModelSpec) -> dict[str, Any]:
        raise NotImplementedError

    def spec(self, config) -> dict[str, Any]:
        raise NotImplementedError

    def links(self, spec: ModelSpec) -> list[Link]:
        raise NotImplementedError

    def parameters_of(self, hf_model) -> dict[str, Any]:
        """Their parameters by name, as the links name them (an architecture that stores several
        tensors in one, such as experts stacked on a leading axis, names views of each)."""
        return dict(hf_model.named_parameters())

    def zeroed(self, spec: ModelSpec) -> list[str]:
        """Their parameters that ours lacks but that compute what ours does when zero (a bias):
        an export writes zeros there, an import refuses a model with anything else there."""
        return []

    def check(self, spec: ModelSpec) -> None:
        """SpecError naming the first field whose value the architecture cannot hold."""
        needed = {**self.requirements(spec), "residual.name": "plain", "tie_qk": False, "n_classes": None}
        for field, wanted in needed.items():
            got = value_at(spec, field)
            if got != wanted:
                raise SpecError(f"model.{field}", f"{self.model_type} ({self.hf_class}) needs {wanted!r}, got {got!r}")
        if spec.head_dim * spec.n_heads != spec.d_model and not self.any_head_dim:
            raise SpecError("model.head_dim", f"{self.model_type} needs head_dim = d_model / n_heads = "
                            f"{spec.d_model // spec.n_heads}, got {spec.head_dim}")

    def hf_config(self, spec: ModelSpec):
        transformers = import_transformers()
        return transformers.AutoConfig.for_model(self.model_type, **{**SPECIAL_IDS, **self.config(spec)})


def ffn_width(spec: ModelSpec) -> int:
    return spec.ffn.params.d_ff or (round(8 * spec.d_model / 3) if spec.ffn.name in ("swiglu", "geglu")
                                    else 4 * spec.d_model)


GELU_ACT = {"none": "gelu", "tanh": "gelu_new"}  # transformers' ACT2FN names
GELU_APPROXIMATE = {v: k for k, v in GELU_ACT.items()} | {"gelu_pytorch_tanh": "tanh"}
