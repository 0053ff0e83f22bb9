"""The JSON Schema of study files (`workbench schema`), with registered variants and tasks
spelled out so editors can complete names and parameters."""

from __future__ import annotations

from typing import Any

from workbench import kinds
from workbench.registry import variants
from workbench.model.spec import VARIANT_AXES, ModelSpec


def variant_json_schema(axis: str) -> dict[str, Any]:
    """A variant field: a registered name, or {name: <registered>, <its params>}."""
    options: list[dict[str, Any]] = [{"type": "string", "enum": sorted(variants(axis))}]
    for name, cls in variants(axis).items():
        params = cls.Params.model_json_schema()
        options.append({
            "type": "object",
            "properties": {"name": {"const": name}, **params.get("properties", {})},
            "required": ["name"],
            "additionalProperties": False,
        })
    return {"anyOf": options}


def study_json_schema() -> dict[str, Any]:
    """JSON Schema of a study file (every kind), with registered variants and tasks spelled
    out so editors can complete names and parameters."""
    # One schema per kind, joined by anyOf: pydantic cannot generate a Union of models whose
    # fields $ref definitions (ModelSection, TaskSection) that are only added below.
    per_kind = [kind.study.model_json_schema() for kind in kinds.study_kinds().values()]
    defs = {name: d for s in per_kind for name, d in s.pop("$defs", {}).items()}
    schema = per_kind[0] if len(per_kind) == 1 else {"anyOf": per_kind}
    schema["$defs"] = defs
    model = ModelSpec.model_json_schema()
    for axis in VARIANT_AXES:
        model["properties"][axis] = {**variant_json_schema(axis), "description": model["properties"][axis].get("description", "")}
    defs["ModelSection"] = model
    tasks = variant_json_schema("task")
    defs["TaskSection"] = {"anyOf": tasks["anyOf"][1:], "description": "{name: <task>, <task params>}"}
    schema = link_sections(schema)
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = "Transformer Workbench study"
    return schema


def link_sections(node: Any) -> Any:
    """Fields typed `{"x-section": NAME}` (a placeholder pydantic accepts) -> a $ref to the
    registry-derived definition NAME."""
    if isinstance(node, dict):
        if "x-section" in node:
            extra = {k: v for k, v in node.items() if k != "x-section"}
            return {"$ref": f"#/$defs/{node['x-section']}", **extra}
        return {k: link_sections(v) for k, v in node.items()}
    if isinstance(node, list):
        return [link_sections(v) for v in node]
    return node
