"""Reward functions by name, and which one scores each data_source.

A reward function has the signature
``fn(data_source, solution_str, ground_truth, extra_info=None) -> float | dict`` and is called
with keyword arguments, as verl calls it; a dict carries ``"score"`` plus extra values that are
logged. Register your own (a function defined at the top level of a module: the scoring
processes find it again by its module and name) with
``@register_reward_fn("name", data_sources=["my/source"])`` or point
``reward.custom_reward_function.path``/``name`` at a file.

Data sources follow verl's ``default_compute_score``: ``math``, ``math_dapo``,
``math_dapo_reasoning`` and every source starting with ``aime`` are DAPO's ±1 ``math_dapo``
scorer; the MATH data sets (``lighteval/MATH``, ``DigitalLearningGmbH/MATH-lighteval``,
``HuggingFaceH4/MATH-500``) are the 1/0 ``math`` scorer (math-verify).
"""

from __future__ import annotations

import dataclasses
import inspect
from typing import Any, Callable, Iterable

from rlvr.registry import Registry
from rlvr.rewards.scorers import arithmetic, countdown, format, gsm8k, math, math_dapo, one_answer, tool_answer

RewardFn = Callable[..., "float | dict"]
REWARD_FNS: Registry[RewardFn] = Registry("reward function")
_DATA_SOURCES: dict[str, str] = {}
_DATA_SOURCE_PREFIXES: dict[str, str] = {}
_NEEDS_GROUND_TRUTH: set[str] = set()


@dataclasses.dataclass(frozen=True)
class TruthCheck:
    """How a row's ``reward_model.ground_truth`` is checked against the reward function that will
    score it, when the dataset loads: a row that fails is refused with its file and line, where
    scoring it would raise (or score 0 whatever the response) at every step."""

    fits: Callable[[Any], bool]
    """Whether the function can score against this ground truth: it does not raise on it, and a
    response can equal it."""
    expects: str
    """What the function compares each response against, for the error: ``"one number"``."""


_TRUTH_CHECKS: dict[str, TruthCheck] = {}


def register_reward_fn(name: str, data_sources: Iterable[str] = (), needs_ground_truth: bool = True,
                       data_source_prefixes: Iterable[str] = (), truth_check: TruthCheck | None = None):
    """Register ``fn`` under ``name`` and make it the scorer of ``data_sources`` and of every data
    source starting with one of ``data_source_prefixes`` (verl's ``aime*``).

    ``needs_ground_truth``: the function compares against ``reward_model.ground_truth``, so a
    dataset row without one is refused when the dataset loads (not scored 0 at every step).
    ``truth_check``: how a present ground truth is checked at load (None: not checked, as rlvr
    cannot know what a function of yours reads); it needs ``needs_ground_truth``.
    ``fn`` must be a function defined at the top level of a module (``def``): a scoring process
    imports it again by module and name, which a lambda, a nested function or a
    ``functools.partial`` does not have."""

    if truth_check is not None and not needs_ground_truth:
        raise ValueError(f"register_reward_fn({name!r}): a truth_check needs needs_ground_truth=True (a function "
                         "that reads no ground truth has none to check)")

    def decorator(fn: RewardFn) -> RewardFn:
        if not inspect.isfunction(fn) or "<" in fn.__qualname__:  # <lambda>, outer.<locals>.inner
            raise TypeError(
                f"register_reward_fn({name!r}) needs a function defined with def at the top level of a module, got "
                f"{getattr(fn, '__qualname__', None) or type(fn).__name__}: scoring processes find the function "
                "again by its module and name. For a partial or a closure, define a module-level function that "
                "calls it with the arguments, or pass them as reward.custom_reward_function.reward_kwargs")
        REWARD_FNS.register(name)(fn)
        for source in data_sources:
            _DATA_SOURCES[source] = name
        for prefix in data_source_prefixes:
            _DATA_SOURCE_PREFIXES[prefix] = name
        if needs_ground_truth:
            _NEEDS_GROUND_TRUTH.add(name)
        if truth_check is not None:
            _TRUTH_CHECKS[name] = truth_check
        return fn

    return decorator


def needs_ground_truth(name: str) -> bool:
    return name in _NEEDS_GROUND_TRUTH


def truth_check(name: str) -> TruthCheck | None:
    """How the ground truth of the reward function ``name`` is checked at load (None: it is not)."""
    return _TRUTH_CHECKS.get(name)


def truth_fits(name: str, truth) -> bool:
    """Whether the reward function ``name`` can score against ``truth`` (true where it declares no check)."""
    check = truth_check(name)
    return check is None or check.fits(truth)


ONE_ANSWER = TruthCheck(one_answer, "one answer (text or a number)")
ONE_NUMBER = TruthCheck(arithmetic.truth_fits, "one number (text such as '12', '-3.5' or '1,234', or a number)")
GSM8K_NUMBER = TruthCheck(gsm8k.truth_fits, "one answer that is a number (what follows GSM8K's '####': '72', "
                          "'$1,234'; not the whole solution)")

for _name, _fn, _sources, _check in [
    ("arithmetic", arithmetic.compute_score, ["arithmetic"], ONE_NUMBER),
    ("countdown", countdown.compute_score, ["countdown"],
     TruthCheck(countdown.truth_fits, "a mapping with 'target' and 'numbers' (integers)")),
    ("tool_answer", tool_answer.compute_score, ["arithmetic_tool"], ONE_NUMBER),  # arithmetic's, on the last turn
    ("gsm8k", gsm8k.compute_score, ["openai/gsm8k", "gsm8k"], GSM8K_NUMBER),
    ("gsm8k_flexible", gsm8k.compute_score_flexible, [], GSM8K_NUMBER),
    ("math", math.compute_score, ["lighteval/MATH", "DigitalLearningGmbH/MATH-lighteval", "HuggingFaceH4/MATH-500"],
     TruthCheck(math.truth_fits, "one answer math-verify can parse (LaTeX or a number)")),
    ("correctness", format.correctness, [], ONE_ANSWER),
    ("digit", format.digit, [], None),
    ("hard_format", format.hard_format, [], None),
    ("soft_format", format.soft_format, [], None),
    ("mark", format.mark, [], None),
]:
    register_reward_fn(_name, _sources, needs_ground_truth=_check is not None, truth_check=_check)(_fn)
register_reward_fn("math_dapo", ["math_dapo", "math", "math_dapo_reasoning"], data_source_prefixes=["aime"],
                   truth_check=ONE_ANSWER)(math_dapo.compute_score)


def known_data_sources() -> list[str]:
    """The data sources with a scorer; ``aime*`` stands for every source starting with ``aime``."""
    return sorted([*_DATA_SOURCES, *(f"{prefix}*" for prefix in _DATA_SOURCE_PREFIXES)])


def reward_fn_name_for(data_source: str) -> str:
    if data_source in _DATA_SOURCES:
        return _DATA_SOURCES[data_source]
    prefixes = [p for p in _DATA_SOURCE_PREFIXES if isinstance(data_source, str) and data_source.startswith(p)]
    if prefixes:
        return _DATA_SOURCE_PREFIXES[max(prefixes, key=len)]  # the most specific prefix
    raise KeyError(
        f"no reward function for data_source {data_source!r}; known data sources: {known_data_sources()}. "
        "Set reward.custom_reward_function.path/name to your own function, list functions in "
        "reward.functions, or register one with @register_reward_fn(name, data_sources=[...])"
    )


def get_scorer(data_source: str) -> RewardFn:
    """The reward function that scores ``data_source``."""
    return REWARD_FNS.get(reward_fn_name_for(data_source))
