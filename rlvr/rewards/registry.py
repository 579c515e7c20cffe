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
from rlvr.rewards.scorers import arithmetic, countdown, format, gsm8k, math

RewardFn = Callable[..., "float | dict"]
REWARD_FNS: Registry[RewardFn] = Registry("reward function")
_DATA_SOURCES: dict[str, str] = {}


def register_reward_fn(name: str, data_sources: Iterable[str] = ()):
    """Register ``fn`` under ``name`` and make it the scorer of ``data_sources``."""

    def decorator(fn: RewardFn) -> RewardFn:
        REWARD_FNS.register(name)(fn)
        for source in data_sources:
            _DATA_SOURCES[source] = name
        return fn

    return decorator


for _name, _fn, _sources in [
    ("arithmetic", arithmetic.compute_score, ["arithmetic"]),
    ("countdown", countdown.compute_score, ["countdown"]),
    ("gsm8k", gsm8k.compute_score, ["openai/gsm8k", "gsm8k"]),
    ("gsm8k_flexible", gsm8k.compute_score_flexible, []),
    ("math", math.compute_score, ["math", "lighteval/MATH", "DigitalLearningGmbH/MATH-lighteval",
                                  "HuggingFaceH4/MATH-500", "math_dapo", "aime"]),
    ("correctness", format.correctness, []),
    ("digit", format.digit, []),
    ("hard_format", format.hard_format, []),
    ("soft_format", format.soft_format, []),
    ("mark", format.mark, []),
]:
    register_reward_fn(_name, _sources)(_fn)


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
