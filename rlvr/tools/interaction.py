"""Interactions: a user or an environment that answers the model between turns (verl's
``BaseInteraction`` and ``multi_turn.interaction_config_path``), with a score per turn.

In the multi-turn loop (``rlvr/rollout/multi_turn.py``) a row whose ``extra_info.interaction_kwargs``
names an interaction gets, after each assistant turn that calls no tool,
``generate_response(instance_id, messages, **interaction_kwargs)`` -> ``(should_terminate,
response_content, current_turn_score, additional_data)``: the content becomes a user turn (its
tokens rendered by the chat template, never trained on), the score is kept in the trajectory's
``turn_scores`` (the reward function reads them from ``extra_info["turn_scores"]``, as verl's
reward loop passes them), and the episode ends when the interaction says so, at
``max_user_turns`` (tool results count too, as in verl) or when the response budget is spent.

The YAML is verl's::

    interaction:
      - name: gsm8k                      # optional: the class name less "Interaction", lowercased
        class_name: rlvr.tools.interaction.Gsm8kInteraction   # or verl's path, or file.py:Name
        config: {}

Departures from verl (whose newest releases removed interactions, April 2026): an episode's
``finalize_interaction(instance_id)`` is called when it ends (verl never called it, so its
example's per-episode state was never freed), and a row without ``interaction_kwargs`` runs
without one instead of failing the rollout.
"""

from __future__ import annotations

import re
import uuid
from pathlib import Path
from typing import Any

import yaml

from rlvr.tools.base import not_coroutines
from rlvr.tools.config import ToolConfigError, import_class

# verl's interaction classes read as rlvr's
VERL_INTERACTIONS = {"verl.interactions.gsm8k_interaction.Gsm8kInteraction": "rlvr.tools.interaction.Gsm8kInteraction"}


INTERACTION_METHODS = ("start_interaction", "generate_response", "finalize_interaction")
"""The methods the multi-turn loop awaits."""


class BaseInteraction:
    """verl's interface: ``start_interaction``, ``generate_response``, ``calculate_score`` and
    ``finalize_interaction`` are coroutines; ``config`` is the YAML entry's ``config`` with its ``name``."""

    def __init__(self, config: dict[str, Any]):
        self.config = config
        self.name: str = config.get("name", "interaction_agent")

    async def start_interaction(self, instance_id: str | None = None, **kwargs) -> str:
        return instance_id or str(uuid.uuid4())

    async def generate_response(self, instance_id: str, messages: list[dict[str, Any]],
                                **kwargs) -> tuple[bool, str, float, dict[str, Any]]:
        """-> (should_terminate_sequence, response_content, current_turn_score, additional_data)."""
        raise NotImplementedError

    async def calculate_score(self, instance_id: str, **kwargs) -> float:
        return 0.0

    async def finalize_interaction(self, instance_id: str, **kwargs) -> None:
        return None


class Gsm8kInteraction(BaseInteraction):
    """verl's example: the last assistant message against the row's ``ground_truth`` (GSM8K's strict
    ``#### answer`` format); correct ends the episode with score 1, wrong asks the model to try again
    with score 0."""

    def __init__(self, config: dict[str, Any]):
        super().__init__(config)
        self.instances: dict[str, dict[str, Any]] = {}

    async def start_interaction(self, instance_id: str | None = None, ground_truth: str | None = None,
                                **kwargs) -> str:
        instance_id = instance_id or str(uuid.uuid4())
        self.instances[instance_id] = {"response": "", "ground_truth": ground_truth}
        return instance_id

    async def generate_response(self, instance_id: str, messages: list[dict[str, Any]], **kwargs):
        last = next((m.get("content") or "" for m in reversed(messages) if m.get("role") == "assistant"), "")
        self.instances[instance_id]["response"] = last
        if await self.calculate_score(instance_id) == 1.0:
            return True, "Your response is correct!", 1.0, {}
        return False, "Your response is incorrect! You need to reflect on your answer and try again.", 0.0, {}

    async def calculate_score(self, instance_id: str, **kwargs) -> float:
        from rlvr.rewards.scorers.gsm8k import compute_score

        state = self.instances[instance_id]
        return float(compute_score("openai/gsm8k", state["response"], state["ground_truth"], method="strict",
                                   format_score=0.0, score=1.0))

    async def finalize_interaction(self, instance_id: str, **kwargs) -> None:
        self.instances.pop(instance_id, None)


def default_name(class_name: str) -> str:
    """verl's: the class's name less a trailing ``Interaction``, lowercased."""
    simple = re.split(r"[.:]", class_name)[-1]
    return (simple[:-len("Interaction")] if simple.endswith("Interaction") else simple).lower()


def interaction_names(path: str | None) -> list[str]:
    """The names the interaction config defines, read before anything is built (to check the
    data's ``interaction_kwargs`` at load); every entry is checked as ``load_interactions`` does."""
    return list(load_interactions(path, build=False))


def load_interactions(path: str | None, build: bool = True) -> dict[str, BaseInteraction | None]:
    """The interactions of a YAML in verl's format by name (see the module docstring); each error
    names the file and the entry. ``build=False``: the names alone, each class imported and checked."""
    if not path:
        return {}
    file = Path(path).expanduser()
    where = f"interaction config {str(file)!r}"
    if not file.is_file():
        raise ToolConfigError(f"{where} does not exist (actor_rollout_ref.rollout.multi_turn.interaction_config_path)")
    data = yaml.safe_load(file.read_text()) or {}
    entries = data.get("interaction") if isinstance(data, dict) else None
    if not isinstance(entries, list) or not entries:
        raise ToolConfigError(f"{where}: expected a list under 'interaction' ([{{name, class_name, config}}, ...])")
    out: dict[str, BaseInteraction] = {}
    for i, entry in enumerate(entries):
        at = f"{where}, entry {i}"
        if not isinstance(entry, dict) or "class_name" not in entry:
            raise ToolConfigError(f"{at}: needs class_name (and optionally name and config)")
        class_name = VERL_INTERACTIONS.get(entry["class_name"], entry["class_name"])
        name = entry.get("name") or default_name(class_name)
        if name in out:
            raise ToolConfigError(f"{at}: a second interaction named {name!r}; each needs its own name")
        cls = import_class(class_name, at, file.parent)
        if not (isinstance(cls, type) and issubclass(cls, BaseInteraction)):
            raise ToolConfigError(f"{at}: {class_name!r} is not a BaseInteraction subclass (rlvr.tools.interaction)")
        sync = not_coroutines(cls, INTERACTION_METHODS)
        if sync:
            raise ToolConfigError(f"{at}: {entry['class_name']!r}: {sync}")
        out[name] = cls({**dict(entry.get("config") or {}), "name": name}) if build else None
    return out
