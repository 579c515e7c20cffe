"""``BaseTool``: verl's tool interface, so a verl tool class carries over.

A tool lives for one trajectory at a time per ``instance_id``: the rollout calls ``create``
once per trajectory and tool, ``execute`` for every call the model makes, and ``calc_reward``
then ``release`` when the trajectory ends. ``execute`` returns the text the model sees, a
step reward and a dict of metrics; the step rewards and ``calc_reward``'s result reach the
reward function in ``extra_info["tool_rewards"]``.

All four methods are coroutines. A tool that blocks (CPU work, a synchronous client) should
do its work in ``asyncio.to_thread`` so the turn's other calls run concurrently;
``@function_tool`` does that for plain functions.
"""

from __future__ import annotations

import uuid
from typing import Any

from rlvr.tools.schema import OpenAIFunctionToolSchema


class ToolError(Exception):
    """A failed call whose message is shown to the model as the tool's output (and counted in
    ``tool/errors``); any other exception a tool raises is reported the same way with its type."""


class ToolBusyError(ToolError):
    """A call refused because the tool's earlier calls are still stuck (counted in ``tool_busy``)."""


class ToolResponse(str):
    """The text a tool returns (a ``str``; verl's newer tools return an object with ``.text``)."""

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
