"""Two tools to copy: a plain function and a tool with per-trajectory state and a reward.

Use them with ``actor_rollout_ref.rollout.multi_turn.tool_config_path=examples/tools/tools.yaml``
(rows name them in ``extra_info.tools_kwargs``; see the README's multi-turn section).
"""

import random

from rlvr.tools import BaseTool, OpenAIFunctionToolSchema, ToolError, function_tool


@function_tool
def convert_length(value: float, unit: str) -> str:
    """Convert a length to metres.

    Args:
        value: the length
        unit: one of mm, cm, m, km, in, ft, mi
    """
    factors = {"mm": 0.001, "cm": 0.01, "m": 1.0, "km": 1000.0, "in": 0.0254, "ft": 0.3048, "mi": 1609.344}
    if unit not in factors:
        raise ToolError(f"unknown unit {unit!r}; use one of {sorted(factors)}")
    return f"{value * factors[unit]:g} m"


class GuessNumber(BaseTool):
    """A hidden number per trajectory: each guess is answered higher/lower; finding it earns 1."""

    @classmethod
    def default_schema(cls):
        return OpenAIFunctionToolSchema.from_dict({"type": "function", "function": {
            "name": "guess", "description": "Guess the hidden number between 1 and 100.",
            "parameters": {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}}})

    async def create(self, instance_id=None, seed=None, **kwargs):
        instance_id = await super().create(instance_id, **kwargs)
        self._instances[instance_id].update(target=random.Random(seed).randint(1, 100), found=False)
        return instance_id

    async def execute(self, instance_id, parameters, **kwargs):
        state = self._instances[instance_id]
        n = parameters["n"]
        if n == state["target"]:
            state["found"] = True
            return "correct", 0.0, {}
        return ("higher" if n < state["target"] else "lower"), -0.01, {}  # a small cost per wrong guess

    async def calc_reward(self, instance_id, **kwargs):
        return 1.0 if self._instances[instance_id]["found"] else 0.0
