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
from rlvr.tools.base import BaseTool, not_coroutines
from rlvr.tools.function_tool import FunctionTool
from rlvr.tools.schema import OpenAIFunctionToolSchema, SchemaError
from rlvr.tools.verl_compat import missing_module_hint, verl_interface

SHIPPED = Path(__file__).parent / "configs"  # calculator.yaml, python.yaml: usable by name
BUILTIN_TOOLS = {"calculator": "rlvr.tools.calculator.CalculatorTool", "python": "rlvr.tools.python.PythonTool"}
# verl's tool classes (verl/tools/): rlvr's own where it has one, else why not (a verl script's tools YAML names them)
VERL_TOOLS = {"verl.tools.gsm8k_tool.Gsm8kTool": "rlvr.tools.gsm8k.Gsm8kTool"}
VERL_TOOLS_REFUSED = {
    "verl.tools.sandbox_fusion_tools.SandboxFusionTool": (
        "it calls a SandboxFusion service; rlvr runs code in a local sandbox: class_name rlvr.tools.python.PythonTool "
        "(its config: timeout_s, memory_mb, ...; see rlvr/tools/configs/python.yaml)"),
    "verl.tools.search_tool.SearchTool": "retrieval tools (a search service) are not implemented",
    "verl.tools.mcp_search_tool.MCPSearchTool": "MCP tools are not implemented",
    "verl.tools.mcp_base_tool.MCPBaseTool": "MCP tools are not implemented",
    "verl.tools.geo3k_tool.Geo3kTool": "rlvr trains text models (geo3k is a vision task)",
    "verl.tools.image_zoom_in_tool.ImageZoomInTool": "rlvr trains text models (the tool crops images)",
}


class ToolConfigError(ConfigError):
    """A tools YAML that cannot be turned into tools: a config error (the file is part of the run's
    config, through ``multi_turn.tool_config_path``), so the command line prints it as one."""


def _import(class_name: str, where: str, base: Path) -> Any:
    """A tool's class: a built-in's name, verl's class path read as rlvr's, or ``import_class``'s."""
    class_name = BUILTIN_TOOLS.get(class_name, VERL_TOOLS.get(class_name, class_name))
    if class_name.startswith("verl."):
        why = VERL_TOOLS_REFUSED.get(class_name, "verl's tool classes are not rlvr tools")
        raise ToolConfigError(f"{where}: {class_name!r} is verl's tool class, and rlvr has none like it: {why}; "
                              f"rlvr's: {sorted(BUILTIN_TOOLS)}, {sorted(VERL_TOOLS)} (read as rlvr's own), or "
                              "your BaseTool subclass / @function_tool function")
    return import_class(class_name, where, base)


def import_class(class_name: str, where: str, base: Path) -> Any:
    """``module.Class``, or ``path/to/file.py:Name`` (a relative path is looked up next to the
    YAML that names it first, then from the working directory)."""
    if class_name.startswith("verl."):
        raise ToolConfigError(f"{where}: {class_name!r} is verl's class, which rlvr does not import (verl is not "
                              "installed beside rlvr); name rlvr's or your own")
    module_name = ""
    try:
        with verl_interface():  # a module written for verl imports verl's tool interface: rlvr's here
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
    except ModuleNotFoundError as err:  # a package the module imports, or the module itself
        why = missing_module_hint(err, module_name) or f"ModuleNotFoundError: {err}"
        raise ToolConfigError(f"{where}: cannot import {class_name!r}: {why}") from None
    except Exception as err:  # ImportError, a syntax error in the user's module, ...
        raise ToolConfigError(f"{where}: cannot import {class_name!r}: {type(err).__name__}: {err}") from None
    if not hasattr(module, attr):
        raise ToolConfigError(f"{where}: {module.__name__!r} has no attribute {attr!r}")
    return getattr(module, attr)


def build_tool(entry: Any, where: str, base: Path = Path("."), instantiate: bool = True) -> BaseTool | None:
    """One ``tools:`` entry -> a tool instance (``instantiate=False``: only check the entry, its class
    and schema, building nothing: what config load does)."""
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
    if not (isinstance(target, FunctionTool) or isinstance(target, type) and issubclass(target, BaseTool)):
        raise ToolConfigError(f"{where}.class_name: {entry['class_name']!r} is neither a BaseTool subclass nor a "
                              "@function_tool function")
    sync = not_coroutines(target)
    if sync:
        raise ToolConfigError(f"{where}.class_name: {entry['class_name']!r}: {sync}")
    if not instantiate:
        return None
    try:
        if isinstance(target, FunctionTool):
            return FunctionTool(target.fn, config, schema or target.tool_schema)
        return target(config, schema)
    except ToolConfigError:
        raise
    except Exception as err:
        raise ToolConfigError(f"{where}: building {entry['class_name']!r} failed: {err}") from None


def load_tools(path: str | Path, instantiate: bool = True) -> dict[str, BaseTool]:
    """The tools of a tools YAML (a path, or the name of a shipped file: calculator, python), by name.
    ``instantiate=False`` checks every entry (its class imports and is a tool) and builds none."""
    path = Path(path).expanduser()
    if not path.is_file() and (SHIPPED / f"{path}.yaml").is_file():  # a shipped tools file by name (a folder of
        path = SHIPPED / f"{path}.yaml"                                # that name, as `rlvr prepare` makes, is not one)
    if not path.is_file():
        what = "is a folder, not a tools YAML" if path.is_dir() else "does not exist"
        raise ToolConfigError(f"tool config {path} {what} (actor_rollout_ref.rollout.multi_turn.tool_config_path)")
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as err:
        raise ToolConfigError(f"{path}: not valid YAML: {err}") from None
    if not isinstance(data, dict) or not isinstance(data.get("tools"), list) or not data["tools"]:
        raise ToolConfigError(f"{path}: must hold a non-empty list under 'tools:'")
    tools: dict[str, BaseTool] = {}
    for i, entry in enumerate(data["tools"]):
        tool = build_tool(entry, f"{path}: tools[{i}]", path.parent, instantiate)
        if tool is None:
            continue
        if tool.name in tools:
            raise ToolConfigError(f"{path}: tools[{i}]: a second tool named {tool.name!r}")
        tools[tool.name] = tool
    return tools
