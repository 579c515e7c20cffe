"""Agent loops with verl's names and shapes (``verl/experimental/agent_loop``).

An agent loop turns one dataset row into one ``AgentLoopOutput``: it asks the engine for tokens
(``await self.server_manager.generate(request_id, prompt_ids=..., sampling_params=...)``), does
whatever it does between calls (tools, an environment, a second message), and returns the
prompt's token ids, the response's token ids with a mask (1 on the tokens the model sampled, 0
on tokens it added) and the sampled tokens' log-probs. Loops register by name:

    @register("my_agent")
    class MyAgentLoop(AgentLoopBase):
        async def run(self, sampling_params, **kwargs) -> AgentLoopOutput: ...

or are listed in ``actor_rollout_ref.rollout.agent.agent_loop_config_path``, a YAML list of
``{name, _target_}`` (verl's format). The dataset column ``agent_name`` picks each row's loop;
``rollout.agent.default_agent_loop`` the others'. ``kwargs`` are the row's columns
(``raw_prompt`` messages, ``raw_prompt_ids``, ``extra_info``, ``data_source``, ...).

A loop's ``reward_score`` is its row's score (a reward function's NaN guards apply: a value that
is not a finite number is counted and its group left out); ``None`` leaves the row to the reward
function of its ``data_source``. Where rlvr departs from verl: ``sampling_params`` is rlvr's
``SamplingParams`` (a loop passes it on, or a ``dataclasses.replace`` of it).
"""

from __future__ import annotations

import importlib
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from uuid import uuid4

import yaml

from rlvr.config import ConfigError
from rlvr.registry import Registry
from rlvr.rollout.sampling import SamplingParams

BUILT_IN = ("single_turn_agent", "tool_agent")
"""Names whose rollout is rlvr's own: one generation (the batch rollout) and the multi-turn tool
loop (``rollout.multi_turn``). A batch whose rows all name these runs no agent loop."""


@dataclass
class TokenOutput:
    """What ``server_manager.generate`` answers: the sampled tokens, their log-probs, why the
    completion ended (``stop`` or ``length``) and the weight version that sampled them."""

    token_ids: list[int]
    log_probs: list[float]
    finish_reason: str
    weight_version: int = 0


@dataclass
class AgentLoopOutput:
    """One row's trajectory (verl's fields). ``response_ids`` follow ``prompt_ids``; every one of
    them has a ``response_mask`` entry (1: sampled by the model, trained on; 0: added by the loop)
    and a ``response_logprobs`` entry (the sampled log-prob; anything where the mask is 0)."""

    prompt_ids: list[int]
    response_ids: list[int]
    response_mask: list[int]
    response_logprobs: list[float] | None = None
    reward_score: float | None = None
    num_turns: int = 0
    metrics: dict[str, float] = field(default_factory=dict)
    extra_fields: dict[str, Any] = field(default_factory=dict)
    split_samples: list["AgentLoopOutput"] = field(default_factory=list)
    """rlvr's: the episode's later samples, where its context stopped extending this one's (the
    agent rewrote it). Each trains with the episode's reward and advantage (``protocol.episode_rows``);
    the last is the episode's final context, which a reward function scores when ``reward_score``
    is None. Their own ``reward_score``, ``metrics`` and ``split_samples`` are not read."""


class AgentLoopBase(ABC):
    """A loop over the engine. ``server_manager.generate`` is its only way to tokens;
    ``tokenizer`` renders and parses text; ``config`` is the run's whole config (verl's
    ``trainer_config``)."""

    def __init__(self, config, server_manager, tokenizer, **kwargs):
        self.config, self.server_manager, self.tokenizer = config, server_manager, tokenizer

    @abstractmethod
    async def run(self, sampling_params: SamplingParams, **kwargs) -> AgentLoopOutput:
        """One row's episode; ``kwargs`` are its columns."""


AGENT_LOOPS: Registry = Registry("agent loop (actor_rollout_ref.rollout.agent, the agent_name column)")


def register(name: str):
    """Register an ``AgentLoopBase`` subclass as ``name`` (verl's ``@register``)."""
    return AGENT_LOOPS.register(name)


def load_agent_loop_config(path: str | None) -> None:
    """Register the loops a YAML list names (``- name: my_agent`` / ``_target_: pkg.module.Class``)."""
    if not path:
        return
    file = Path(path).expanduser()
    try:
        entries = yaml.safe_load(file.read_text())
    except (OSError, yaml.YAMLError) as err:
        raise ConfigError(f"actor_rollout_ref.rollout.agent.agent_loop_config_path = {path}: {err}") from None
    if not isinstance(entries, list):
        raise ConfigError(f"{file}: write a list of {{name, _target_}} entries (verl's agent loop config)")
    for i, entry in enumerate(entries):
        if not isinstance(entry, dict) or not {"name", "_target_"} <= set(entry):
            raise ConfigError(f"{file}: entry {i} is {entry!r}; each entry needs name and _target_ (module.Class)")
        module, _, cls_name = str(entry["_target_"]).rpartition(".")
        try:
            cls = getattr(importlib.import_module(module), cls_name)
        except (ImportError, AttributeError, ValueError) as err:
            raise ConfigError(f"{file}: entry {i} ({entry['name']}): cannot import {entry['_target_']}: {err}") from None
        if not (isinstance(cls, type) and issubclass(cls, AgentLoopBase)):
            raise ConfigError(f"{file}: entry {i} ({entry['name']}): {entry['_target_']} is not an AgentLoopBase")
        register(str(entry["name"]))(cls)


@register("single_turn_agent")
class SingleTurnAgentLoop(AgentLoopBase):
    """One generation from the row's prompt tokens (as the batch rollout makes it)."""

    async def run(self, sampling_params: SamplingParams, **kwargs) -> AgentLoopOutput:
        prompt_ids = list(kwargs["raw_prompt_ids"])
        out = await self.server_manager.generate(uuid4().hex, prompt_ids=prompt_ids, sampling_params=sampling_params)
        return AgentLoopOutput(prompt_ids, out.token_ids, [1] * len(out.token_ids), out.log_probs, num_turns=2)
