"""Scorers by data_source. Each has the signature
``score(data_source, solution_str, ground_truth, extra_info) -> float | dict``."""

from __future__ import annotations

from typing import Callable

from rlvr.rewards import arithmetic

Scorer = Callable[..., float | dict]

_SCORERS: dict[str, Scorer] = {
    "arithmetic": arithmetic.compute_score,
}


def known_data_sources() -> list[str]:
    return sorted(_SCORERS)


def get_scorer(data_source: str) -> Scorer:
    if data_source not in _SCORERS:
        raise KeyError(
            f"no reward function for data_source {data_source!r}; known: {known_data_sources()}. "
            "Point reward.custom_reward_function.path/name at your own function"
        )
    return _SCORERS[data_source]
