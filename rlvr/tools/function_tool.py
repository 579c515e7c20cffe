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
function runs in a daemon thread of its own so the other calls of a turn are not held up. A
thread cannot be stopped: a call that outlives the rollout's timeout keeps running, "stuck".
Daemon threads are not joined at exit (an executor's are, so one stuck call kept the trainer
from ever exiting), and once ``max_stuck_calls`` calls of a tool are stuck its new calls are
refused (``ToolBusyError``, counted in ``multi_turn/tool_busy``) until one of them returns,
so stuck threads do not pile up step after step. The tools YAML sets it under ``config:``.
"""

from __future__ import annotations

import asyncio
import inspect
import re
import threading
import typing
from typing import Any, Callable

from rlvr.tools.base import BaseTool, ToolBusyError
from rlvr.tools.schema import OpenAIFunctionToolSchema

DEFAULT_MAX_STUCK_CALLS = 4
"""Calls of one sync function tool that may outlive their timeout before it refuses new calls."""

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
        limit = self.config.get("max_stuck_calls", DEFAULT_MAX_STUCK_CALLS)
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
            raise ValueError(f"config.max_stuck_calls must be an integer >= 1, got {limit!r}")
        self.max_stuck_calls = limit
        self.stuck = 0  # calls abandoned by their caller whose thread still runs
        self._lock = threading.Lock()

    async def execute(self, instance_id: str, parameters: dict[str, Any], **execute_kwargs) -> tuple[str, float, dict]:
        if inspect.iscoroutinefunction(self.fn):
            result = await self.fn(**parameters)
        else:
            result = await self._in_thread(parameters)
        if isinstance(result, tuple):
            text, reward, metrics = result
            return str(text), float(reward), dict(metrics)
        return str(result), 0.0, {}

    async def _in_thread(self, parameters: dict[str, Any]) -> Any:
        """``fn(**parameters)`` in a daemon thread; a cancelled wait (a timeout) leaves it stuck."""
        if self.stuck >= self.max_stuck_calls:
            raise ToolBusyError(f"{self.name} has {self.stuck} earlier calls still running past their timeout; "
                                "this call is refused until one of them returns")
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        call = {"finished": False, "abandoned": False}

        def deliver(result: Any, error: BaseException | None) -> None:
            if future.done():
                return
            if error is not None:
                future.set_exception(error)
            else:
                future.set_result(result)

        def work() -> None:
            result, error = None, None
            try:
                result = self.fn(**parameters)
            except BaseException as err:  # delivered to the caller, raised there
                error = err
            with self._lock:
                call["finished"] = True
                if call["abandoned"]:
                    self.stuck -= 1
                    return
            try:
                loop.call_soon_threadsafe(deliver, result, error)
            except RuntimeError:  # the loop closed without waiting for this call
                pass

        threading.Thread(target=work, name=f"function_tool:{self.name}", daemon=True).start()
        try:
            return await future
        except asyncio.CancelledError:
            with self._lock:
                if not call["finished"]:
                    call["abandoned"] = True
                    self.stuck += 1
            raise

    def __call__(self, *args, **kwargs):
        """The decorated function stays callable as itself."""
        return self.fn(*args, **kwargs)


def function_tool(fn: Callable | None = None, *, name: str | None = None):
    """Decorator: ``@function_tool`` or ``@function_tool(name="...")`` -> a ``FunctionTool``."""
    if fn is None:
        return lambda f: FunctionTool(f, name=name)
    return FunctionTool(fn)
