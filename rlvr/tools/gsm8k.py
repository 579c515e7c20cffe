"""The ``gsm8k`` answer-checking tool: verl's ``verl.tools.gsm8k_tool.Gsm8kTool`` on rlvr's scorer.

The model submits an answer; the tool says whether it parses to the row's ground truth
(``create_kwargs.ground_truth``, which verl's GSM8K preprocessing writes under
``extra_info.tools_kwargs.calc_gsm8k_reward``). As verl's: the reply is ``Current parsed
answer=... reward=...``, a submission that does not improve on the trajectory's best so far gets a
step reward of -0.05, and ``calc_reward`` is the last submission's score (flexible parsing).
"""

from __future__ import annotations

from typing import Any

from rlvr.rewards.scorers.gsm8k import compute_score
from rlvr.tools.base import BaseTool
from rlvr.tools.schema import OpenAIFunctionToolSchema

NOT_IMPROVED_PENALTY = -0.05


class Gsm8kTool(BaseTool):
    def __init__(self, config: dict | None, tool_schema: OpenAIFunctionToolSchema | None):
        super().__init__(config, tool_schema)
        self._state: dict[str, dict[str, Any]] = {}  # instance id -> ground truth, last answer, best reward

    @classmethod
    def default_schema(cls) -> OpenAIFunctionToolSchema:
        return OpenAIFunctionToolSchema.from_dict({"type": "function", "function": {
            "name": "calc_gsm8k_reward", "description": "Check an answer to the GSM8K problem (1.0 if correct)",
            "parameters": {"type": "object", "properties": {
                "answer": {"type": "string", "description": "the final answer, digits only"}},
                "required": ["answer"]}}}, "gsm8k tool")

    async def create(self, instance_id: str | None = None, ground_truth: Any = None, **create_kwargs) -> str:
        instance_id = await super().create(instance_id)
        self._state[instance_id] = {"ground_truth": ground_truth, "response": "", "reward": 0.0}
        return instance_id

    async def execute(self, instance_id: str, parameters: dict[str, Any], **execute_kwargs) -> tuple[str, float, dict]:
        answer = str(parameters.get("answer", ""))
        state = self._state[instance_id]
        state["response"] = answer if answer.startswith("#### ") else f"#### {answer}"
        reward = await self.calc_reward(instance_id)
        step_reward = 0.0 if reward > state["reward"] else NOT_IMPROVED_PENALTY
        state["reward"] = reward
        return f"Current parsed answer={answer!r} reward={reward!r}", step_reward, {}

    async def calc_reward(self, instance_id: str, **calc_reward_kwargs) -> float:
        state = self._state[instance_id]
        if state["ground_truth"] is None:
            return 0.0
        return compute_score("openai/gsm8k", state["response"], state["ground_truth"], method="flexible")

    async def release(self, instance_id: str, **release_kwargs) -> None:
        self._state.pop(instance_id, None)
