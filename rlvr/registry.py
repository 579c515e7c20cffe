"""A name -> function registry that lists the known names on a miss.

As in verl, registering the same function again under its name is allowed (a module imported
twice); a different function under a taken name is refused. An Enum name registers its value.
"""

from __future__ import annotations

import enum
import hashlib
import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Callable, Generic, TypeVar

F = TypeVar("F", bound=Callable)


class Registry(Generic[F]):
    def __init__(self, kind: str):
        self.kind = kind
        self._entries: dict[str, F] = {}

    def register(self, name: "str | enum.Enum") -> Callable[[F], F]:
        if isinstance(name, enum.Enum):
            name = name.value

        def decorator(fn: F) -> F:
            if name in self._entries and not _same_function(self._entries[name], fn):
                raise ValueError(
                    f"{self.kind} {name!r} is already registered (by {self._entries[name].__qualname__}); "
                    "choose another name"
                )
            self._entries[name] = fn
            return fn

        return decorator

    def get(self, name: "str | enum.Enum") -> F:
        if isinstance(name, enum.Enum):
            name = name.value
        if name not in self._entries:
            raise ValueError(f"unknown {self.kind} {name!r}; registered: {self.names()}")
        return self._entries[name]

    def names(self) -> list[str]:
        return sorted(self._entries)

    def summaries(self) -> dict[str, str]:
        """Name -> the first line of the function's docstring."""
        return {n: ((self._entries[n].__doc__ or "").strip().splitlines() or [""])[0] for n in self.names()}


def _same_function(a: Callable, b: Callable) -> bool:
    """The same object, or the same function from a module imported twice (same file and name)."""
    if a is b:
        return True
    code_a, code_b = getattr(a, "__code__", None), getattr(b, "__code__", None)
    return (code_a is not None and code_b is not None and a.__qualname__ == b.__qualname__
            and code_a.co_filename == code_b.co_filename and code_a.co_firstlineno == code_b.co_firstlineno)


def import_file(path: Path, prefix: str) -> ModuleType:
    """The Python file ``path`` as a module, imported once per resolved path (so the functions
    it registers are registered once). A file whose import fails is not kept half-imported. The
    module's name comes from the path's digest, the same in every process (``hash()`` of a
    string is salted per process), so a function pickled in one process resolves in another
    that imported the same file."""
    return import_file_as(path, f"{prefix}_{hashlib.sha1(str(path.resolve()).encode()).hexdigest()[:16]}")


def import_file_as(path: Path, name: str) -> ModuleType:
    """The Python file ``path`` as the module ``name`` (once): another process finds a function
    of an imported file again by the module name it had in the first process and the file."""
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        try:
            spec.loader.exec_module(module)
        except BaseException:
            del sys.modules[name]
            raise
    return sys.modules[name]
