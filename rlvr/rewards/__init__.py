"""Reward functions: scorers looked up by a row's data_source."""

from rlvr.rewards.registry import get_scorer, known_data_sources

__all__ = ["get_scorer", "known_data_sources"]
