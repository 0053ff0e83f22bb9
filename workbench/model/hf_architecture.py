"""What every Hugging Face architecture of workbench.model.hf holds: the requirements a spec must
meet, the config both ways and the weight links (workbench.model.state_links), as one class each
(workbench.model.hf_decoders, workbench.model.hf_encoders); and the helpers they share."""

from __future__ import annotations

from typing import Any

from workbench.errors import SpecError, WorkbenchError
from workbench.model.spec import VARIANT_AXES, ModelSpec
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


def value_at(spec: ModelSpec, field: str, layer: int | None = None) -> Any:
    """'norm.type' -> spec.norm.params.type; 'norm.name' -> spec.norm.name; 'bias' -> spec.bias.
    With `layer`, a variant field is that layer's (ModelSpec.at)."""
    axis, _, key = field.partition(".")
    value = getattr(spec, axis) if layer is None or not key else spec.at(axis, layer)
    if not key:
        return value
    return value.name if key == "name" else getattr(value.params, key, None)


CHECKED_LATER = ("attention", "position")  # axes whose later options every architecture checks


def later_options(params) -> dict[str, Any]:
    """The options of a variant added after the first architectures (its Params' `added_later`:
    attention's QK-norm, gate, value residual, scale_dim, softcap; RoPE's interpolation, ...),
    each with its default."""
    fields = type(params).model_fields
    return {name: fields[name].default for klass in type(params).__mro__
            for name in vars(klass).get("added_later", ())}


class Architecture:
    """One HF architecture: what a spec must hold, the config both ways, the weight links."""

    model_type: str
    hf_class: str  # the transformers class export writes and from_hf reads
    auto_class: str  # the transformers Auto class that loads an export
    unmapped: tuple[str, ...] = ()  # prefixes of their parameters outside what ours computes (left out)
    build_kwargs: dict[str, Any] = {}  # for hf_class(config, ...) in an export
    any_head_dim = False  # HF derives head_dim = d_model / n_heads (True: the config holds its own)
    per_layer: tuple[str, ...] = ()  # variant axes the config may set per layer (Gemma's attention)

    def requirements(self, spec: ModelSpec) -> dict[str, Any]:
        """Dotted spec field -> the value the architecture needs, in the order they are checked."""
        raise NotImplementedError

    def layer_requirements(self, spec: ModelSpec, layer: int) -> dict[str, Any]:
        """Dotted variant field -> the value layer `layer`'s variant needs, checked after
        `requirements`. An attention or position option added later (`later_options`) named in
        neither must be at its default: an architecture computes only the options it names."""
        return {}

    def config(self, spec: ModelSpec) -> dict[str, Any]:
        raise NotImplementedError

    def spec(self, config) -> dict[str, Any]:
        raise NotImplementedError

    def links(self, spec: ModelSpec) -> list[Link]:
        raise NotImplementedError

    def tensors(self, model: Any) -> dict[str, Any]:
        """The tensors of a model (ours or theirs) the links read and write, by name: its
        parameters. An architecture with state outside them (a buffer), or with tensors stacked
        where ours are apart, adds or splits them here (views: a write reaches the model)."""
        return dict(model.named_parameters())

    def zeroed(self, spec: ModelSpec) -> list[str]:
        """Their parameters that ours lacks but that compute what ours does when zero (a bias):
        an export writes zeros there, an import refuses a model with anything else there."""
        return []

    def check(self, spec: ModelSpec) -> None:
        """SpecError naming the first field whose value the architecture cannot hold."""
        for axis in VARIANT_AXES:
            if axis not in self.per_layer:
                spec.uniform(axis, f"{self.model_type} ({self.hf_class})")
        needed = {"logit_softcap": None, "embedding_scale": "none", **self.requirements(spec),
                  "residual.name": "plain", "tie_qk": False, "n_classes": None}
        for field, wanted in needed.items():
            got = value_at(spec, field)
            if got != wanted:
                raise SpecError(f"model.{field}", f"{self.model_type} ({self.hf_class}) needs {wanted!r}, got {got!r}")
        named = set(needed)  # an option `requirements` names is checked there
        for layer in range(max(spec.encoder_layers if spec.family != "decoder" else 0,
                               spec.decoder_layers if spec.family != "encoder" else 0)):
            defaults = {f"{axis}.{name}": default for axis in CHECKED_LATER
                        for name, default in later_options(spec.at(axis, layer).params).items()}
            needed = {**{field: default for field, default in defaults.items() if field not in named},
                      **self.layer_requirements(spec, layer)}
            for field, wanted in needed.items():
                got = value_at(spec, field, layer)
                if got != wanted:
                    at = f" at layer {layer}" if self.per_layer else ""
                    raise SpecError(f"model.{field}", f"{self.model_type} ({self.hf_class}) needs {wanted!r}{at}, "
                                    f"got {got!r}")
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
