"""A name -> function registry that refuses duplicates and lists the known names on a miss."""

from __future__ import annotations

from typing import Callable, Generic, TypeVar

F = TypeVar("F", bound=Callable)


class Registry(Generic[F]):
    def __init__(self, kind: str):
        self.kind = kind
        self._entries: dict[str, F] = {}

    def register(self, name: str) -> Callable[[F], F]:
        def decorator(fn: F) -> F:
            if name in self._entries:
                raise ValueError(
                    f"{self.kind} {name!r} is already registered (by {self._entries[name].__qualname__}); "
                    "choose another name"
                )
            self._entries[name] = fn
            return fn

        return decorator

    def get(self, name: str) -> F:
        if name not in self._entries:
            raise ValueError(f"unknown {self.kind} {name!r}; registered: {self.names()}")
        return self._entries[name]

    def names(self) -> list[str]:
        return sorted(self._entries)

    def summaries(self) -> dict[str, str]:
        """Name -> the first line of the function's docstring."""
        return {n: (self._entries[n].__doc__ or "").strip().splitlines()[0] for n in self.names()}
