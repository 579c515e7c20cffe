"""Data metrics: lengths and their clip ratios against the configured limits."""

import torch

from rlvr.protocol import DataProto
from rlvr.trainer.metrics import compute_data_metrics


def test_length_clip_ratios_use_the_configured_limits():
    # prompts of 3 and 2 tokens (batch padded to 3), responses of 4 and 1 tokens (padded to 4)
    attention_mask = torch.tensor([[1, 1, 1, 1, 1, 1, 1], [0, 1, 1, 1, 0, 0, 0]])
    response_mask = attention_mask[:, 3:]
    zeros = torch.zeros(2, 4)
    batch = DataProto.from_dict({"attention_mask": attention_mask, "responses": torch.zeros(2, 4, dtype=torch.long),
                                 "response_mask": response_mask, "token_level_scores": zeros,
                                 "token_level_rewards": zeros, "advantages": zeros, "returns": zeros})
    metrics = compute_data_metrics(batch, max_response_length=4, max_prompt_length=8)
    assert metrics["response_length/clip_ratio"] == 0.5  # one of two responses reached 4 tokens
    assert metrics["prompt_length/clip_ratio"] == 0.0  # the longest prompt (3) is under the limit of 8
    assert (metrics["prompt_length/mean"], metrics["response_length/mean"]) == (2.5, 2.5)
