"""The model spec: the mapping a study's `model:` section holds and `build_model` takes.

Variant fields accept a name (`"rope"`) or a mapping with `name` and parameters
(`{"name": "sliding_window", "window": 64}`); both resolve to a `Choice` that carries the
registered class and its validated parameters. Any variant field may instead be given per
layer (`LayerPattern`): a list with one variant per layer of each stack, or
`{repeat: [...]}`, cycled over the layers (Gemma 3's five local layers to one global:
`attention: {repeat: [swa, swa, swa, swa, swa, full]}`). `ModelSpec.at(axis, layer)` is the
variant of one layer either way.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator, model_validator

from workbench.errors import SpecError
from workbench.registry import get_variant
from workbench.variants import AXIS, MODEL_AXES, FieldError, Params, StrictModel, without_later_defaults


class Choice(BaseModel):
    """A variant selected by name, with its validated parameters."""

    model_config = ConfigDict(frozen=True, arbitrary_types_allowed=True)
    name: str
    params: Params
    cls: type = Field(exclude=True)

    def as_dict(self) -> dict[str, Any]:
        return {"name": self.name, **without_later_defaults(self.params, self.params.model_dump())}


def resolve_choice(axis: str, value: Any, field: str) -> Choice:
    """'rope' or {'name': 'rope', 'base': 500} -> Choice; SpecError naming `field` otherwise."""
    if isinstance(value, Choice):
        return value
    if isinstance(value, str):
        name, raw = value, {}
    elif isinstance(value, Mapping):
        if "name" not in value:
            raise SpecError(field, "a variant mapping needs a 'name' key")
        raw = dict(value)
        name = raw.pop("name")
    else:
        raise SpecError(field, f"expected a variant name or a mapping with 'name', got {value!r}")
    cls = get_variant(axis, str(name), field)
    try:
        params = cls.Params.model_validate(raw)
    except ValidationError as err:
        raise spec_error_from(err, prefix=field) from None
    return Choice(name=str(name), params=params, cls=cls)


class LayerPattern(BaseModel):
    """A variant per layer: written as a list (`items`, one per layer of each stack) or as
    `{repeat: items}` (layer i gets items[i mod len], so the pattern need not divide the depth)."""

    model_config = ConfigDict(frozen=True, arbitrary_types_allowed=True)
    items: tuple[Choice, ...]
    repeat: bool

    def at(self, layer: int) -> Choice:
        return self.items[layer % len(self.items)] if self.repeat else self.items[layer]

    def as_dict(self) -> list[dict[str, Any]] | dict[str, list[dict[str, Any]]]:
        items = [item.as_dict() for item in self.items]
        return {"repeat": items} if self.repeat else items

    @property
    def distinct(self) -> list[Choice]:
        """Each different variant of the pattern, in order of first use."""
        return list({canonical(item): item for item in self.items}.values())

    @property
    def name(self) -> str:
        """The compact label reports and listings print: `repeat[sliding_window(window=4)*5, full]`."""
        return pattern_label(self.as_dict())


def variant_label(value: Mapping[str, Any]) -> str:
    """A variant mapping as `name(param=value, ...)`."""
    params = ", ".join(f"{k}={v}" for k, v in value.items() if k != "name")
    return f"{value['name']}({params})" if params else str(value["name"])


def pattern_label(value: list | Mapping) -> str:
    """A per-layer pattern of variant mappings, `[a, a, b]` or `{repeat: [...]}`, as `[a*2, b]` or
    `repeat[a*2, b]`: runs of one variant collapsed, each as `variant_label` writes it."""
    items = value["repeat"] if isinstance(value, Mapping) else value
    runs: list[list] = []
    for text in map(variant_label, items):
        if runs and runs[-1][0] == text:
            runs[-1][1] += 1
        else:
            runs.append([text, 1])
    inner = ", ".join(text if count == 1 else f"{text}*{count}" for text, count in runs)
    return f"repeat[{inner}]" if isinstance(value, Mapping) else f"[{inner}]"


def is_pattern(value: Any) -> bool:
    """A stored per-layer pattern: a list of variant mappings, or {repeat: that}."""
    items = value["repeat"] if isinstance(value, Mapping) and set(value) == {"repeat"} else value
    return isinstance(items, list) and bool(items) and all(isinstance(i, Mapping) and "name" in i for i in items)


def canonical(choice: Choice) -> str:
    return json.dumps(choice.as_dict(), sort_keys=True, default=str)


def resolve_axis(axis: str, value: Any, field: str) -> Choice | LayerPattern:
    """A variant field: one Choice, or a LayerPattern for a list or {repeat: [...]}. A pattern
    whose items are all one variant is that variant (the same model, the same run id)."""
    if isinstance(value, (Choice, LayerPattern)):
        return value
    repeat = isinstance(value, Mapping) and "repeat" in value and "name" not in value
    if repeat:
        extra = sorted(set(value) - {"repeat"})
        if extra:
            raise SpecError(f"{field}.{extra[0]}", "unknown key beside `repeat`", ["repeat"])
        items, field = value["repeat"], f"{field}.repeat"
        if not isinstance(items, list):
            raise SpecError(field, f"expected a list of variants to cycle over the layers, got {items!r}")
    elif isinstance(value, list):
        items = value
    else:
        return resolve_choice(axis, value, field)
    if not items:
        raise SpecError(field, "an empty list: give one variant per layer, or a name for every layer")
    choices = tuple(resolve_choice(axis, item, f"{field}.{i}") for i, item in enumerate(items))
    if len({canonical(c) for c in choices}) == 1:
        return choices[0]
    return LayerPattern(items=choices, repeat=repeat)


def spec_error_from(err: ValidationError, prefix: str = "") -> SpecError:
    """Turn pydantic's report into one SpecError naming the first bad field."""
    first = err.errors()[0]
    path = ".".join(str(part) for part in (prefix, *first["loc"]) if part != "")
    inner = (first.get("ctx") or {}).get("error")
    if isinstance(inner, SpecError):  # raised by a validator that named its field already
        return inner
    if isinstance(inner, FieldError):  # raised by the model at `path`, about one of its fields
        return SpecError(f"{path}.{inner.field}" if path else inner.field, inner.problem)
    problem = first["msg"]
    if first["type"] == "extra_forbidden":
        problem = "unknown key"
        ctx = err.errors()[0].get("ctx") or {}
        choices = ctx.get("expected")
        return SpecError(path, problem, choices)
    if "input" in first and first["type"] != "missing":
        given = repr(first["input"])
        problem += f" (got {given if len(given) <= 80 else given[:60] + f'... ({len(given)} characters)'})"
    return SpecError(path, problem)


VARIANT_AXES = MODEL_AXES  # the model fields that name a variant


class ModelSpec(StrictModel):
    """Everything that defines a model's architecture."""

    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True)
    added_later: ClassVar[tuple[str, ...]] = ("embedding_norm", "logit_softcap", "embedding_scale")  # see variants.without_later_defaults

    family: Literal["encoder", "decoder", "encoder_decoder"] = Field(
        "decoder", description="encoder (bidirectional), decoder (causal LM), or encoder_decoder"
    )
    vocab_size: int = Field(256, ge=2, description="token ids are 0..vocab_size-1 (tasks set it)")
    d_model: int = Field(128, gt=0, description="width of the residual stream")
    n_layers: int = Field(2, gt=0, description="blocks per stack")
    n_encoder_layers: int | None = Field(None, gt=0, description="encoder depth (encoder_decoder); default n_layers")
    n_decoder_layers: int | None = Field(None, gt=0, description="decoder depth (encoder_decoder); default n_layers")
    n_heads: int = Field(4, gt=0, description="query heads per attention layer")
    n_kv_heads: int | None = Field(None, gt=0, description="K/V heads: n_heads = MHA, 1 = MQA, between = GQA")
    head_dim: int | None = Field(None, gt=0, description="width of one head; default d_model // n_heads")
    # Each variant field may also be given per layer: a list (one per layer) or {repeat: [...]}.
    position: Any = Field("rope", description="position scheme: a name or {name: ..., params}; per layer, only "
                          "schemes that act inside attention (rope, alibi, none, ...) may differ")
    attention: Any = Field("full", description="attention variant: a name or {name: ..., params}; or per layer, a "
                           "list or {repeat: [...]} (e.g. five sliding-window layers to one full)")
    norm: Any = Field("pre", description="norm placement: a name or {name: ..., type: layernorm|rmsnorm}")
    ffn: Any = Field("gelu", description="feed-forward type: a name or {name: ..., d_ff: ...}")
    residual: Any = Field(AXIS["residual"].absent_means, description="how each sublayer joins the residual "
                          "stream: plain x + f(x), layerscale, rezero, deepnorm (with norm: post), or a plugin's")
    embedding_norm: Literal["none", "layernorm", "rmsnorm"] = Field(
        "none", description="a norm on the embeddings (after the position signal), as BERT, BART and BLOOM have; "
        "its eps is model.norm's"
    )
    embedding_scale: Literal["none", "sqrt_d_model"] = Field(
        "none", description="multiply the token embeddings by sqrt(d_model) before the position signal (Vaswani et "
        "al. 2017, 3.4; Gemma); the tied output head reads the unscaled table"
    )
    tie_qk: bool = Field(False, description="share the query and key projection (symmetric scores)")
    bias: bool = Field(False, description="biases in linear layers")
    dropout: float = Field(0.0, ge=0, lt=1, description="dropout on residual branches and embeddings")
    tie_embeddings: bool = Field(True, description="output head shares the token embedding matrix")
    n_classes: int | None = Field(None, ge=2, description="encoder: size of the sequence-classification head")
    logit_softcap: float | None = Field(None, gt=0, description="cap * tanh(logits / cap) on the output logits "
                                        "(Gemma 2's final_logit_softcapping); null: none")

    @field_validator(*VARIANT_AXES, mode="before")
    @classmethod
    def _variant(cls, v, info: ValidationInfo):
        return resolve_axis(info.field_name, v, f"model.{info.field_name}")

    def at(self, axis: str, layer: int) -> Choice:
        """The variant of `axis` at layer `layer` (0-based, within its stack)."""
        value = getattr(self, axis)
        return value.at(layer) if isinstance(value, LayerPattern) else value

    def each(self, axis: str) -> list[Choice]:
        """Every different variant of `axis` the model uses (one unless it is given per layer)."""
        value = getattr(self, axis)
        return value.distinct if isinstance(value, LayerPattern) else [value]

    def uniform(self, axis: str, needed_by: str) -> Choice:
        """The one variant of `axis`; SpecError naming the field when it is given per layer and
        `needed_by` (what reads it) needs one."""
        value = getattr(self, axis)
        if isinstance(value, LayerPattern):
            raise SpecError(f"model.{axis}", f"{needed_by} needs one {AXIS[axis].noun} for every layer, got the "
                            f"per-layer pattern {value.name}")
        return value

    @model_validator(mode="after")
    def _shapes(self):
        if self.head_dim is None and self.d_model % self.n_heads:
            raise SpecError(
                "model.n_heads",
                f"{self.n_heads} heads do not divide d_model={self.d_model}; "
                f"use a divisor of {self.d_model} or set head_dim",
            )
        # Defaults resolved once, here (the model is frozen afterwards): every reader sees one
        # head_dim and one n_kv_heads, never None.
        self.__dict__.update(head_dim=self.head_dim or self.d_model // self.n_heads,
                             n_kv_heads=self.n_kv_heads or self.n_heads)
        if self.n_kv_heads > self.n_heads or self.n_heads % self.n_kv_heads:
            raise SpecError(
                "model.n_kv_heads",
                f"{self.n_kv_heads} K/V heads must divide n_heads={self.n_heads} "
                f"(valid: {', '.join(str(g) for g in range(1, self.n_heads + 1) if self.n_heads % g == 0)})",
            )
        if self.tie_qk and self.n_kv_heads != self.n_heads:
            raise SpecError("model.tie_qk", "tying Q and K needs n_kv_heads == n_heads")
        if self.n_classes is not None and self.family != "encoder":
            raise SpecError("model.n_classes", "only the encoder family has a classification head")
        self._check_patterns()
        return self

    def _check_patterns(self) -> None:
        depths = sorted({self.encoder_layers if self.family != "decoder" else 0,
                         self.decoder_layers if self.family != "encoder" else 0} - {0})
        for axis in VARIANT_AXES:
            value = getattr(self, axis)
            if isinstance(value, LayerPattern) and not value.repeat and any(len(value.items) != d for d in depths):
                raise SpecError(f"model.{axis}", f"a list gives one {AXIS[axis].noun} per layer: {len(value.items)} "
                                f"for {' and '.join(map(str, depths))} layers; write {{repeat: [...]}} to cycle a "
                                "shorter pattern over the layers")
        if isinstance(self.position, LayerPattern):
            embedding = [c.name for c in self.position.distinct if c.cls.adds_to_embeddings()]
            if embedding:
                raise SpecError("model.position", f"{embedding[0]} adds its signal to the embeddings, once per stack: "
                                "per layer, only schemes that act inside attention (rotate queries and keys, or bias "
                                "scores, or none) may differ")
        first_values = getattr(self.at("attention", 0).params, "value_residual", "none") != "none"
        for layer in range(max(depths)):
            if not first_values and getattr(self.at("attention", layer).params, "value_residual", "none") != "none":
                raise SpecError("model.attention", f"value_residual at layer {layer} mixes in the first layer's "
                                "values, and the first layer's attention leaves none: set value_residual there too")
            residual, norm = self.at("residual", layer), self.at("norm", layer)
            needed = residual.cls.norm_placement
            if needed not in (None, norm.name):
                where = f" at layer {layer}" if isinstance(self.residual, LayerPattern) or isinstance(
                    self.norm, LayerPattern) else ""
                raise SpecError("model.residual", f"{residual.name} is defined with norm: {needed}, and "
                                f"model.norm is {norm.name!r}{where}: set model.norm: {needed}")

    def cross_attention(self, layer: int) -> Choice:
        """encoder_decoder's cross-attention at `layer`: full attention (a query reads every real
        encoder position), scaled (and softcapped) as that layer's self-attention is, so the
        unscaled ablation reaches every score."""
        from workbench.model.attention import KERNEL_OPTIONS  # torch: imported when a model is built

        params = self.at("attention", layer).params
        options = {name: getattr(params, name) for name in KERNEL_OPTIONS if hasattr(params, name)}
        return resolve_choice("attention", {"name": "full", **options}, "model.attention")

    @property
    def encoder_layers(self) -> int:
        return self.n_encoder_layers or self.n_layers

    @property
    def decoder_layers(self) -> int:
        return self.n_decoder_layers or self.n_layers

    def resolved(self) -> dict[str, Any]:
        """Plain, fully resolved mapping (variants with all their parameters) for storage."""
        out = without_later_defaults(self, self.model_dump(exclude=set(VARIANT_AXES)))
        for axis in VARIANT_AXES:
            stored = getattr(self, axis).as_dict()
            if stored != {"name": AXIS[axis].absent_means}:  # an axis added later is left out at its default
                out[axis] = stored
        return out


def parse_spec(spec: Mapping[str, Any] | ModelSpec) -> ModelSpec:
    """Validate a model mapping; raises SpecError naming the field."""
    if isinstance(spec, ModelSpec):
        return spec
    try:
        return ModelSpec.model_validate(dict(spec))
    except ValidationError as err:
        # A SpecError raised inside a validator arrives wrapped: unwrap it to keep its field.
        inner = err.errors()[0].get("ctx", {}).get("error")
        if isinstance(inner, SpecError):
            raise inner from None
        raise spec_error_from(err, prefix="model") from None
