"""The OpenAI function-tool schema as typed data, checked when it is read.

A tool is described to the model (and to the chat template) by the schema OpenAI's
function calling uses, which verl's tool configs carry under ``tool_schema``::

    {"type": "function",
     "function": {"name": "calculator",
                  "description": "Evaluate an arithmetic expression exactly.",
                  "parameters": {"type": "object",
                                 "properties": {"expression": {"type": "string", "description": "..."}},
                                 "required": ["expression"]}}}

``check_arguments`` checks the arguments a model passed against the schema, so a tool is only
called with what it declared; the problems become the tool's error message to the model.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

JSON_TYPES: dict[str, tuple[type, ...]] = {
    "string": (str,), "integer": (int,), "number": (int, float), "boolean": (bool,),
    "array": (list,), "object": (dict,), "null": (type(None),),
}


class SchemaError(ValueError):
    """A tool schema that is not a valid OpenAI function schema."""


@dataclass
class OpenAIFunctionPropertySchema:
    type: str | list[str]
    description: str | None = None
    enum: list[Any] | None = None
    items: dict[str, Any] | None = None


@dataclass
class OpenAIFunctionParametersSchema:
    type: str = "object"
    properties: dict[str, OpenAIFunctionPropertySchema] = field(default_factory=dict)
    required: list[str] = field(default_factory=list)


@dataclass
class OpenAIFunctionSchema:
    name: str
    description: str = ""
    parameters: OpenAIFunctionParametersSchema = field(default_factory=OpenAIFunctionParametersSchema)
    strict: bool = False


@dataclass
class OpenAIFunctionToolSchema:
    type: str
    function: OpenAIFunctionSchema

    @property
    def name(self) -> str:
        return self.function.name

    @classmethod
    def from_dict(cls, data: Any, where: str = "tool_schema") -> "OpenAIFunctionToolSchema":
        """Parse and check a schema dict; errors name ``where`` and the offending key."""
        if not isinstance(data, dict):
            raise SchemaError(f"{where}: must be a mapping with 'type: function' and 'function', got {type(data).__name__}")
        if data.get("type") != "function":
            raise SchemaError(f"{where}.type: must be 'function', got {data.get('type')!r}")
        fn = data.get("function")
        if not isinstance(fn, dict):
            raise SchemaError(f"{where}.function: missing or not a mapping (needs name, description, parameters)")
        name = fn.get("name")
        if not isinstance(name, str) or not name.replace("_", "").replace("-", "").isalnum():
            raise SchemaError(f"{where}.function.name: must be a non-empty name of letters, digits, '_' or '-', got {name!r}")
        description = fn.get("description", "")
        if not isinstance(description, str):
            raise SchemaError(f"{where}.function.description: must be a string")
        unknown = set(fn) - {"name", "description", "parameters", "strict"}
        if unknown:
            raise SchemaError(f"{where}.function: unknown keys {sorted(unknown)} (known: name, description, parameters, strict)")
        params = _parameters(fn.get("parameters", {"type": "object", "properties": {}}), f"{where}.function.parameters")
        return cls("function", OpenAIFunctionSchema(name, description, params, bool(fn.get("strict", False))))

    @classmethod
    def model_validate(cls, data: Any) -> "OpenAIFunctionToolSchema":
        """pydantic's name for ``from_dict``: verl's schemas are pydantic models, and verl tools build theirs so."""
        return cls.from_dict(data)

    def model_dump(self) -> dict[str, Any]:
        """pydantic's name for ``to_dict`` (without pydantic's options)."""
        return self.to_dict()

    def to_dict(self) -> dict[str, Any]:
        props = {}
        for key, p in self.function.parameters.properties.items():
            props[key] = {k: v for k, v in (("type", p.type), ("description", p.description), ("enum", p.enum),
                                             ("items", p.items)) if v is not None}
        params = {"type": "object", "properties": props, "required": list(self.function.parameters.required)}
        return {"type": "function", "function": {"name": self.function.name, "description": self.function.description,
                                                 "parameters": params}}


def _parameters(data: Any, where: str) -> OpenAIFunctionParametersSchema:
    if not isinstance(data, dict) or data.get("type", "object") != "object":
        raise SchemaError(f"{where}: must be a mapping with type 'object'")
    props = data.get("properties", {}) or {}
    if not isinstance(props, dict):
        raise SchemaError(f"{where}.properties: must be a mapping of parameter name -> schema")
    properties = {}
    for key, spec in props.items():
        if not isinstance(spec, dict) or "type" not in spec:
            raise SchemaError(f"{where}.properties.{key}: must be a mapping with a 'type'")
        types = spec["type"] if isinstance(spec["type"], list) else [spec["type"]]
        bad = [t for t in types if not isinstance(t, str) or t not in JSON_TYPES]  # a dict is unhashable: not `in`
        if bad:
            raise SchemaError(f"{where}.properties.{key}.type: {bad[0]!r} is not a JSON schema type ({sorted(JSON_TYPES)})")
        enum = spec.get("enum")
        if enum is not None and not isinstance(enum, list):
            raise SchemaError(f"{where}.properties.{key}.enum: must be a list")
        properties[key] = OpenAIFunctionPropertySchema(spec["type"], spec.get("description"), enum, spec.get("items"))
    required = data.get("required", []) or []
    if not isinstance(required, list) or any(not isinstance(r, str) or r not in properties for r in required):
        raise SchemaError(f"{where}.required: must list names among the properties {sorted(properties)}, got {required!r}")
    return OpenAIFunctionParametersSchema("object", properties, list(required))


def check_arguments(schema: OpenAIFunctionToolSchema, arguments: Any) -> list[str]:
    """Problems with ``arguments`` (a parsed JSON object) for this tool; empty when they fit."""
    if not isinstance(arguments, dict):
        return [f"arguments must be a JSON object, got {type(arguments).__name__}"]
    params = schema.function.parameters
    problems = [f"missing required argument {r!r}" for r in params.required if r not in arguments]
    for key, value in arguments.items():
        spec = params.properties.get(key)
        if spec is None:
            problems.append(f"unknown argument {key!r} (expected {sorted(params.properties)})")
            continue
        types = spec.type if isinstance(spec.type, list) else [spec.type]
        ok = any(isinstance(value, JSON_TYPES[t]) and not (t in ("integer", "number") and isinstance(value, bool))
                 for t in types)
        if not ok:
            problems.append(f"argument {key!r} must be of type {spec.type}, got {type(value).__name__}")
        elif spec.enum is not None and value not in spec.enum:
            problems.append(f"argument {key!r} must be one of {spec.enum}, got {value!r}")
    return problems
