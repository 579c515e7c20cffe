"""Reward functions by name, and which one scores each data_source.

A reward function has the signature
``fn(data_source, solution_str, ground_truth, extra_info=None) -> float | dict``; a dict
carries ``"score"`` plus extra values that are logged. Register your own with
``@register_reward_fn("name", data_sources=["my/source"])`` or point
``reward.custom_reward_function.path``/``name`` at a file.
"""

from __future__ import annotations

from typing import Callable, Iterable

from rlvr.registry import Registry
from rlvr.rewards.scorers import arithmetic, countdown, format, gsm8k, math, tool_answer

RewardFn = Callable[..., "float | dict"]
REWARD_FNS: Registry[RewardFn] = Registry("reward function")
_DATA_SOURCES: dict[str, str] = {}
_NEEDS_GROUND_TRUTH: set[str] = set()


def register_reward_fn(name: str, data_sources: Iterable[str] = (), needs_ground_truth: bool = True):
    """Register ``fn`` under ``name`` and make it the scorer of ``data_sources``.

    ``needs_ground_truth``: the function compares against ``reward_model.ground_truth``, so a
    dataset row without one is refused when the dataset loads (not scored 0 at every step)."""

    def decorator(fn: RewardFn) -> RewardFn:
        REWARD_FNS.register(name)(fn)
        for source in data_sources:
            _DATA_SOURCES[source] = name
        if needs_ground_truth:
            _NEEDS_GROUND_TRUTH.add(name)
        return fn

    return decorator


def needs_ground_truth(name: str) -> bool:
    return name in _NEEDS_GROUND_TRUTH


for _name, _fn, _sources, _needs_truth in [
    ("arithmetic", arithmetic.compute_score, ["arithmetic"], True),
    ("countdown", countdown.compute_score, ["countdown"], True),
    ("tool_answer", tool_answer.compute_score, ["arithmetic_tool"], True),
    ("gsm8k", gsm8k.compute_score, ["openai/gsm8k", "gsm8k"], True),
    ("gsm8k_flexible", gsm8k.compute_score_flexible, [], True),
    ("math", math.compute_score, ["math", "lighteval/MATH", "DigitalLearningGmbH/MATH-lighteval",
                                  "HuggingFaceH4/MATH-500", "math_dapo", "aime"], True),
    ("correctness", format.correctness, [], True),
    ("digit", format.digit, [], False),
    ("hard_format", format.hard_format, [], False),
    ("soft_format", format.soft_format, [], False),
    ("mark", format.mark, [], False),
]:
    register_reward_fn(_name, _sources, _needs_truth)(_fn)


def known_data_sources() -> list[str]:
    return sorted(_DATA_SOURCES)


def reward_fn_name_for(data_source: str) -> str:
    if data_source not in _DATA_SOURCES:
        raise KeyError(
            f"no reward function for data_source {data_source!r}; known data sources: {known_data_sources()}. "
            "Set reward.custom_reward_function.path/name to your own function, list functions in "
            "reward.functions, or register one with @register_reward_fn(name, data_sources=[...])"
        )
    return _DATA_SOURCES[data_source]


def get_scorer(data_source: str) -> RewardFn:
    """The reward function that scores ``data_source``."""
    return REWARD_FNS.get(reward_fn_name_for(data_source))
