"""Tools a model can call during a multi-turn rollout (verl's BaseTool interface).

- ``BaseTool`` (``base.py``): the async create / execute / calc_reward / release lifecycle, and
  ``CallSlots``, a tool's cap on its calls at once;
- ``@function_tool`` (``function_tool.py``): a typed, documented Python function as a tool;
- ``load_tools`` (``config.py``): the tools YAML in verl's format; a tool module written for
  verl imports verl's tool interface as rlvr's (``verl_compat.py``);
- built-in tools: ``calculator`` (exact arithmetic) and ``python`` (a sandboxed process);
- tool-call parsers (``parsers.py``): ``hermes`` and the plain ``tag`` format.
"""

from rlvr.tools.base import BaseTool, CallSlots, ToolBusyError, ToolError, ToolResponse
from rlvr.tools.calculator import CalculatorTool, calculate
from rlvr.tools.config import ToolConfigError, load_tools
from rlvr.tools.function_tool import FunctionTool, function_tool, schema_from_function
from rlvr.tools.schema import OpenAIFunctionToolSchema, SchemaError, check_arguments

__all__ = ["BaseTool", "CallSlots", "CalculatorTool", "FunctionTool", "OpenAIFunctionToolSchema", "SchemaError",
           "ToolConfigError", "ToolBusyError", "ToolError", "ToolResponse", "calculate", "check_arguments",
           "function_tool", "load_tools", "schema_from_function"]
