"""Reading the tools YAML (verl's format) into tool objects.

::

    tools:
      - class_name: rlvr.tools.calculator.CalculatorTool   # module.Class, or path/to/file.py:Class
        config: {type: native}
        tool_schema:                                          # optional for tools with a default schema
          type: function
          function: {name: calculator, description: ..., parameters: {...}}

``class_name`` may also name a function decorated with ``@function_tool`` (its schema comes
from the function). Every problem names the file, the tool's index and the key.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

import yaml

from rlvr.config import ConfigError
from rlvr.registry import import_file
from rlvr.tools.base import BaseTool
from rlvr.tools.function_tool import FunctionTool
from rlvr.tools.schema import OpenAIFunctionToolSchema, SchemaError

SHIPPED = Path(__file__).parent / "configs"  # calculator.yaml, python.yaml: usable by name
BUILTIN_TOOLS = {"calculator": "rlvr.tools.calculator.CalculatorTool", "python": "rlvr.tools.python.PythonTool"}


class ToolConfigError(ConfigError):
    """A tools YAML that cannot be turned into tools: a config error (the file is part of the run's
    config, through ``multi_turn.tool_config_path``), so the command line prints it as one."""


def _import(class_name: str, where: str, base: Path) -> Any:
    """``module.Class``, or ``path/to/file.py:Name`` (a relative path is looked up next to the
    tools YAML first, then from the working directory)."""
    class_name = BUILTIN_TOOLS.get(class_name, class_name)
    try:
        if ":" in class_name:  # path/to/file.py:Name
            path, _, attr = class_name.rpartition(":")
            file = Path(path).expanduser()
            if not file.is_absolute() and (base / file).exists():
                file = base / file
            module = import_file(file, "rlvr_tools")
        else:
            module_name, _, attr = class_name.rpartition(".")
            if not module_name:
                raise ToolConfigError(f"{where}: class_name {class_name!r} must be module.Class or file.py:Class "
                                      f"(or a built-in tool: {sorted(BUILTIN_TOOLS)})")
            module = importlib.import_module(module_name)
    except ToolConfigError:
        raise
    except Exception as err:  # ImportError, a syntax error in the user's module, ...
        raise ToolConfigError(f"{where}: cannot import {class_name!r}: {type(err).__name__}: {err}") from None
    if not hasattr(module, attr):
        raise ToolConfigError(f"{where}: {module.__name__!r} has no attribute {attr!r}")
    return getattr(module, attr)


def build_tool(entry: Any, where: str, base: Path = Path(".")) -> BaseTool:
    """One ``tools:`` entry -> a tool instance."""
    if not isinstance(entry, dict) or "class_name" not in entry:
        raise ToolConfigError(f"{where}: each tool needs a class_name (and optional config, tool_schema)")
    unknown = set(entry) - {"class_name", "config", "tool_schema"}
    if unknown:
        raise ToolConfigError(f"{where}: unknown keys {sorted(unknown)} (known: class_name, config, tool_schema)")
    config = entry.get("config") or {}
    if not isinstance(config, dict):
        raise ToolConfigError(f"{where}.config: must be a mapping")
    if config.get("type", "native") != "native":
        raise ToolConfigError(f"{where}.config.type: {config['type']!r} is not supported; rlvr runs 'native' tools "
                              "(MCP tools are not implemented)")
    schema = None
    if entry.get("tool_schema") is not None:
        try:
            schema = OpenAIFunctionToolSchema.from_dict(entry["tool_schema"], f"{where}.tool_schema")
        except SchemaError as err:
            raise ToolConfigError(str(err)) from None
    target = _import(str(entry["class_name"]), f"{where}.class_name", base)
    try:
        if isinstance(target, FunctionTool):
            return FunctionTool(target.fn, config, schema or target.tool_schema)
        if isinstance(target, type) and issubclass(target, BaseTool):
            return target(config, schema)
    except ToolConfigError:
        raise
    except Exception as err:
        raise ToolConfigError(f"{where}: building {entry['class_name']!r} failed: {err}") from None
    raise ToolConfigError(f"{where}.class_name: {entry['class_name']!r} is neither a BaseTool subclass nor a "
                          "@function_tool function")


def load_tools(path: str | Path) -> dict[str, BaseTool]:
    """The tools of a tools YAML (a path, or the name of a shipped file: calculator, python), by name."""
    path = Path(path).expanduser()
    if not path.exists() and (SHIPPED / f"{path}.yaml").exists():  # a shipped tools file by name
        path = SHIPPED / f"{path}.yaml"
    if not path.exists():
        raise ToolConfigError(f"tool config {path} does not exist (actor_rollout_ref.rollout.multi_turn.tool_config_path)")
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as err:
        raise ToolConfigError(f"{path}: not valid YAML: {err}") from None
    if not isinstance(data, dict) or not isinstance(data.get("tools"), list) or not data["tools"]:
        raise ToolConfigError(f"{path}: must hold a non-empty list under 'tools:'")
    tools: dict[str, BaseTool] = {}
    for i, entry in enumerate(data["tools"]):
        tool = build_tool(entry, f"{path}: tools[{i}]", path.parent)
        if tool.name in tools:
            raise ToolConfigError(f"{path}: tools[{i}]: a second tool named {tool.name!r}")
        tools[tool.name] = tool
    return tools
