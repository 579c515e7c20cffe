"""``BaseTool``: verl's tool interface, so a verl tool class carries over.

A tool lives for one trajectory at a time per ``instance_id``: the rollout calls ``create``
once per trajectory and tool, ``execute`` for every call the model makes, and ``calc_reward``
then ``release`` when the trajectory ends. ``execute`` returns the text the model sees, a
step reward and a dict of metrics; the step rewards and ``calc_reward``'s result reach the
reward function in ``extra_info["tool_rewards"]``.

All four methods are coroutines. A tool that blocks (CPU work, a synchronous client) should
do its work in ``asyncio.to_thread`` so the turn's other calls run concurrently;
``@function_tool`` does that for plain functions.

A tool whose calls must not all run at once (the python tool: one process per call) returns
a ``CallSlots.hold()`` from ``call_slot``: the rollout holds the slot before it starts a call's
timeout, so time spent waiting for one is not counted against the call.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import inspect
import uuid
import weakref
from typing import Any, AsyncContextManager, AsyncIterator

from rlvr.tools.schema import OpenAIFunctionToolSchema


TOOL_METHODS = ("create", "execute", "calc_reward", "release")
"""The methods the rollout awaits."""


def not_coroutines(obj: Any, names: tuple[str, ...] = TOOL_METHODS) -> str | None:
    """Why ``obj`` (a tool or interaction, or its class) cannot be awaited as rlvr does, or None:
    the methods among ``names`` that are plain ``def`` rather than ``async def``."""
    sync = [name for name in names if not inspect.iscoroutinefunction(getattr(obj, name, None))]
    if not sync:
        return None
    return (f"{', '.join(sync)} {'is' if len(sync) == 1 else 'are'} not a coroutine function (rlvr awaits "
            f"{'it' if len(sync) == 1 else 'them'}, as verl does): write `async def`, with blocking work in "
            "`await asyncio.to_thread(...)`" + (" (or make a plain function a tool with @function_tool)"
                                                 if names == TOOL_METHODS else ""))


class ToolError(Exception):
    """A failed call whose message is shown to the model as the tool's output (and counted in
    ``multi_turn/tool_errors``); any other exception a tool raises is reported the same way with its type."""


class ToolBusyError(ToolError):
    """A call refused because the tool's earlier calls are still stuck (counted in ``tool_busy``)."""


_HELD: contextvars.ContextVar[frozenset] = contextvars.ContextVar("rlvr_tool_slots_held", default=frozenset())
"""The ``CallSlots`` whose slot the running call holds (a task started inside inherits it)."""


class CallSlots:
    """At most ``limit`` calls of one tool at once; the others wait for a slot.

    ``hold()`` is re-entrant within one call: the rollout takes the slot before it starts the
    call's timeout, and the tool's ``execute`` takes it again for callers that did not; a call
    that holds a slot does not wait for a second (which, with every slot held by waiting
    callers, would never come). The count is per event loop (an asyncio semaphore belongs to
    one); rlvr runs a rollout's calls on one loop.
    """

    def __init__(self, limit: int):
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
            raise ValueError(f"a tool's call limit must be an integer >= 1, got {limit!r}")
        self.limit = limit
        self._semaphores = weakref.WeakKeyDictionary()  # event loop -> its asyncio.Semaphore

    @contextlib.asynccontextmanager
    async def hold(self) -> AsyncIterator[None]:
        held = _HELD.get()
        if self in held:
            yield
            return
        semaphore = self._semaphores.setdefault(asyncio.get_running_loop(), asyncio.Semaphore(self.limit))
        async with semaphore:
            token = _HELD.set(held | {self})
            try:
                yield
            finally:
                _HELD.reset(token)


class ToolResponse(str):
    """The text a tool returns: a ``str``, built as verl's is (``ToolResponse(text=...)``, whose
    ``.text`` it has) or as a string; verl's ``image`` and ``video`` are refused (rlvr's tools
    answer text)."""

    def __new__(cls, text: str | None = None, image=None, video=None):
        if image is not None or video is not None:
            raise ValueError("ToolResponse: rlvr's tools answer text; image and video responses are not supported")
        return super().__new__(cls, "" if text is None else text)

    @property
    def text(self) -> str:
        return str(self)


class BaseTool:
    """Subclass and implement ``execute`` (and ``create``/``release`` when a trajectory holds state)."""

    def __init__(self, config: dict | None, tool_schema: OpenAIFunctionToolSchema | None):
        self.config = dict(config or {})
        self.tool_schema = tool_schema or self.default_schema()
        if self.tool_schema is None:
            raise ValueError(f"{type(self).__name__} needs a tool_schema (it has no default_schema)")
        self.name = self.tool_schema.function.name
        self._instances: dict[str, dict[str, Any]] = {}

    @classmethod
    def default_schema(cls) -> OpenAIFunctionToolSchema | None:
        """The schema used when the tools YAML gives none (built-in tools have one)."""
        return None

    def get_openai_tool_schema(self) -> OpenAIFunctionToolSchema:
        return self.tool_schema

    def call_slot(self) -> AsyncContextManager[None]:
        """Held around each call by the rollout, outside the call's timeout: a tool that caps
        its concurrent calls returns its ``CallSlots.hold()``; by default there is no cap."""
        return contextlib.nullcontext()

    async def create(self, instance_id: str | None = None, **create_kwargs) -> str:
        """Start the tool's state for one trajectory; returns the instance id."""
        instance_id = instance_id or str(uuid.uuid4())
        self._instances[instance_id] = {"create_kwargs": create_kwargs, "rewards": []}
        return instance_id

    async def execute(self, instance_id: str, parameters: dict[str, Any], **execute_kwargs) -> tuple[str, float, dict]:
        """Run one call: -> (text for the model, step reward, metrics)."""
        raise NotImplementedError(f"{type(self).__name__}.execute")

    async def calc_reward(self, instance_id: str, **calc_reward_kwargs) -> float:
        """The tool's reward for the whole trajectory (0 unless the tool overrides it)."""
        return 0.0

    async def release(self, instance_id: str, **release_kwargs) -> None:
        """Free the trajectory's state."""
        self._instances.pop(instance_id, None)
