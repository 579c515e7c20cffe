"""Rewards: reward functions by data_source, the reward manager, the reward model."""

from rlvr.rewards.manager import RewardError, RewardManager, RewardResult, load_function, place_on_last_token
from rlvr.rewards.registry import REWARD_FNS, get_scorer, known_data_sources, register_reward_fn

__all__ = ["REWARD_FNS", "RewardError", "RewardManager", "RewardResult", "get_scorer", "known_data_sources",
           "load_function", "place_on_last_token", "register_reward_fn"]
