"""verl's tool interface under verl's module names, for tool modules written for verl.

A verl tool starts ``from verl.tools.base_tool import BaseTool`` (an interaction
``from verl.interactions.base import BaseInteraction``). rlvr does not include verl; an
installed verl, imported, runs ``verl/__init__.py``, which imports verl's protocol and what it
needs (tensordict, ray, ...) though a tool uses none of it. While rlvr imports a tool or
interaction module (``verl_interface``), these names are rlvr's own classes:

    verl.tools.base_tool       BaseTool, OpenAIFunctionToolSchema, ToolResponse
    verl.tools.schemas         OpenAIFunctionToolSchema and its parts, ToolResponse
    verl.utils.rollout_trace   rollout_trace_op (rlvr has no rollout tracing: it returns the function)
    verl.interactions.base     BaseInteraction

so such a module loads as an rlvr tool (a subclass of verl's own ``BaseTool`` would not be one).
Without verl installed, its packages (``verl``, ``verl.tools``, ...) are made empty for the
import; verl's other modules (``verl.utils.reward_score``) are verl's code, and importing one
fails with its name (``import_class`` adds ``pip install verl``). With verl installed, the
packages and those modules import from it as usual, ``verl/__init__.py`` included: a package it
needs and does not find is named, with its pip command.

Where this departs from verl: verl's ``schemas`` are pydantic models; rlvr's are dataclasses
with pydantic's ``model_validate`` and ``model_dump``, which verl tools call.
"""

from __future__ import annotations

import contextlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
from typing import Any, Callable, Iterator

PACKAGES = ("verl", "verl.tools", "verl.utils", "verl.interactions")


def rollout_trace_op(func: Callable) -> Callable:
    """verl's decorator that traces a tool call to weave or mlflow; rlvr traces nothing."""
    return func


def _names(module: str) -> dict[str, Any]:
    """What rlvr puts in the verl module named ``module``. Imported here, not at the top:
    rlvr.tools.interaction imports rlvr.tools.config, which imports this module."""
    from rlvr.tools.base import BaseTool, ToolResponse
    from rlvr.tools.interaction import BaseInteraction
    from rlvr.tools.schema import (OpenAIFunctionParametersSchema, OpenAIFunctionPropertySchema, OpenAIFunctionSchema,
                                   OpenAIFunctionToolSchema)

    return {
        "verl.tools.base_tool": {"BaseTool": BaseTool, "OpenAIFunctionToolSchema": OpenAIFunctionToolSchema,
                                 "ToolResponse": ToolResponse},
        "verl.tools.schemas": {"OpenAIFunctionToolSchema": OpenAIFunctionToolSchema,
                               "OpenAIFunctionSchema": OpenAIFunctionSchema,
                               "OpenAIFunctionParametersSchema": OpenAIFunctionParametersSchema,
                               "OpenAIFunctionPropertySchema": OpenAIFunctionPropertySchema,
                               "ToolResponse": ToolResponse},
        "verl.utils.rollout_trace": {"rollout_trace_op": rollout_trace_op},
        "verl.interactions.base": {"BaseInteraction": BaseInteraction},
    }[module]


INTERFACE = ("verl.tools.base_tool", "verl.tools.schemas", "verl.utils.rollout_trace", "verl.interactions.base")


class VerlInterface(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """The import hook: rlvr's classes for ``INTERFACE``; empty ``PACKAGES`` when verl is not installed."""

    def find_spec(self, name: str, path=None, target=None) -> importlib.machinery.ModuleSpec | None:
        if name in INTERFACE:
            return importlib.util.spec_from_loader(name, self, origin="rlvr.tools.verl_compat")
        if name in PACKAGES and importlib.machinery.PathFinder.find_spec("verl") is None:
            return importlib.util.spec_from_loader(name, self, origin="rlvr.tools.verl_compat", is_package=True)
        return None

    def create_module(self, spec):
        return None  # the default module

    def exec_module(self, module) -> None:
        if module.__name__ in INTERFACE:
            module.__dict__.update(_names(module.__name__))


HOOK = VerlInterface()


@contextlib.contextmanager
def verl_interface() -> Iterator[None]:
    """verl's tool interface importable as rlvr's (see the module docstring) for the duration."""
    if HOOK in sys.meta_path:  # an import inside one
        yield
        return
    sys.meta_path.insert(0, HOOK)
    try:
        yield
    finally:
        sys.meta_path.remove(HOOK)


def missing_module_hint(err: ModuleNotFoundError, importing: str) -> str | None:
    """What a tool module that failed with ``err`` lacks and how to install it (None: the module
    ``importing`` itself is what is missing, not a package it imports)."""
    missing = err.name or ""
    if not missing or importing == missing or importing.startswith(missing + "."):
        return None
    top = missing.split(".")[0]
    if top == "verl":
        return (f"it imports {missing}, which is verl's own code: rlvr stands in only for verl's tool interface "
                f"({', '.join(INTERFACE)}); use rlvr's counterpart, or install verl (pip install verl)")
    return f"it imports {missing}, and the package {top!r} is not installed here (pip install {top})"
