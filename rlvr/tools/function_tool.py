"""``@function_tool``: a plain Python function (sync or async) as a tool.

The schema comes from the signature and the docstring: the first paragraph is the tool's
description, ``Args:`` lines (Google style, ``name: text``) describe the parameters, type
hints give the JSON types, and parameters without a default are required::

    @function_tool
    def add(a: int, b: int) -> str:
        '''Add two integers.

        Args:
            a: the first number
            b: the second number
        '''
        return str(a + b)

The function returns the text for the model, or ``(text, step_reward, metrics)``. A sync
function runs in a worker thread so the other calls of a turn are not held up.
"""

from __future__ import annotations

import asyncio
import inspect
import re
import typing
from typing import Any, Callable

from rlvr.tools.base import BaseTool
from rlvr.tools.schema import OpenAIFunctionToolSchema

_JSON_TYPE = {str: "string", int: "integer", float: "number", bool: "boolean", list: "array", dict: "object"}


def _json_type(hint: Any, where: str) -> str:
    origin = typing.get_origin(hint) or hint
    if origin in _JSON_TYPE:
        return _JSON_TYPE[origin]
    raise TypeError(f"{where}: type hint {hint!r} has no JSON type; use str, int, float, bool, list or dict")


def _docstring_parts(doc: str) -> tuple[str, dict[str, str]]:
    """(description, {parameter: description}) from a Google-style docstring."""
    doc = inspect.cleandoc(doc or "")
    head, _, rest = doc.partition("\nArgs:")
    description = " ".join(head.split("\n\n")[0].split())
    params = {}
    for line in rest.splitlines():
        m = re.match(r"\s+(\w+)(?:\s*\([^)]*\))?\s*:\s*(.+)", line)
        if m:
            params[m.group(1)] = m.group(2).strip()
        elif line.strip() and not line.startswith((" ", "\t")):
            break  # the next section
    return description, params


def schema_from_function(fn: Callable, name: str | None = None) -> OpenAIFunctionToolSchema:
    """The OpenAI schema of ``fn`` (see the module docstring)."""
    where = f"@function_tool {fn.__qualname__}"
    description, param_docs = _docstring_parts(fn.__doc__ or "")
    if not description:
        raise TypeError(f"{where}: the function needs a docstring (its first line describes the tool to the model)")
    hints = typing.get_type_hints(fn)
    properties, required = {}, []
    for pname, param in inspect.signature(fn).parameters.items():
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            continue
        if pname not in hints:
            raise TypeError(f"{where}: parameter {pname!r} needs a type hint")
        properties[pname] = {"type": _json_type(hints[pname], f"{where}, parameter {pname!r}")}
        if pname in param_docs:
            properties[pname]["description"] = param_docs[pname]
        if param.default is inspect.Parameter.empty:
            required.append(pname)
    return OpenAIFunctionToolSchema.from_dict(
        {"type": "function", "function": {"name": name or fn.__name__, "description": description,
                                          "parameters": {"type": "object", "properties": properties,
                                                         "required": required}}}, where)


class FunctionTool(BaseTool):
    """A tool whose ``execute`` calls a Python function with the model's arguments."""

    def __init__(self, fn: Callable, config: dict | None = None, tool_schema: OpenAIFunctionToolSchema | None = None,
                 name: str | None = None):
        self.fn = fn
        super().__init__(config, tool_schema or schema_from_function(fn, name))

    async def execute(self, instance_id: str, parameters: dict[str, Any], **execute_kwargs) -> tuple[str, float, dict]:
        if inspect.iscoroutinefunction(self.fn):
            result = await self.fn(**parameters)
        else:
            result = await asyncio.to_thread(self.fn, **parameters)
        if isinstance(result, tuple):
            text, reward, metrics = result
            return str(text), float(reward), dict(metrics)
        return str(result), 0.0, {}

    def __call__(self, *args, **kwargs):
        """The decorated function stays callable as itself."""
        return self.fn(*args, **kwargs)


def function_tool(fn: Callable | None = None, *, name: str | None = None):
    """Decorator: ``@function_tool`` or ``@function_tool(name="...")`` -> a ``FunctionTool``."""
    if fn is None:
        return lambda f: FunctionTool(f, name=name)
    return FunctionTool(fn)
