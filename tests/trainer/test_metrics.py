"""Data metrics: lengths and their clip ratios against the configured limits."""

import math

import numpy as np
import pytest
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


def test_validation_metrics_mean_std_and_bootstrap_follow_verl():
    from rlvr.trainer.metrics import bootstrap_sizes, validation_metrics

    assert bootstrap_sizes(8) == [2, 4, 8] and bootstrap_sizes(6) == [2, 4, 6] and bootstrap_sizes(2) == [2]
    # prompt a: scores 1, 0, 0, 0 (answers x, y, y, z); prompt b: 1, 1, 1, 1 (all "w")
    sources = ["s"] * 8
    groups = ["a"] * 4 + ["b"] * 4
    scores = [1, 0, 0, 0, 1, 1, 1, 1]
    answers = ["x", "y", "y", "z", "w", "w", "w", "w"]
    m = validation_metrics(sources, groups, scores, answers, n_bootstrap=20000)
    assert m["val-core/s/reward/mean@4"] == 0.625  # (0.25 + 1) / 2
    assert m["val-aux/s/reward/std@4"] == pytest.approx((0.25 ** 0.5 * 0.75 ** 0.5 + 0.0) / 2)  # population std
    # best of k draws with replacement from a: 1 - (3/4)^k; b: always 1
    assert m["val-aux/s/reward/best@2/mean"] == pytest.approx((1 - 0.75 ** 2 + 1) / 2, abs=0.01)
    assert m["val-core/s/reward/best@4/mean"] == pytest.approx((1 - 0.75 ** 4 + 1) / 2, abs=0.01)
    # worst of k from a is 1 only if every draw is the 1: (1/4)^k
    assert m["val-aux/s/reward/worst@2/mean"] == pytest.approx((0.25 ** 2 + 1) / 2, abs=0.01)
    # majority of 4 draws from a: "y" (score 0) unless x is drawn more often than y ... the score is 1 only
    # when x wins the vote; it is never above best@4
    assert m["val-core/s/reward/maj@4/mean"] <= m["val-core/s/reward/best@4/mean"]
    assert m["val-aux/s/reward/best@4/std"] > 0 and "val-core/s/reward/best@4/std" not in m
    # the same seed gives the same bootstrap
    assert validation_metrics(sources, groups, scores, answers, n_bootstrap=100) == \
        validation_metrics(sources, groups, scores, answers, n_bootstrap=100)


def test_validation_majority_vote_breaks_ties_by_first_drawn():
    from rlvr.trainer.metrics import _majority_scores

    scores = np.array([[1.0, 0.0, 0.0], [0.0, 1.0, 1.0], [1.0, 0.0, 0.5]])
    codes = np.array([[0, 1, 1], [2, 0, 0], [0, 1, 2]])  # row 0: answer 1 twice; row 1: answer 0 twice; row 2: tie
    assert _majority_scores(scores, codes).tolist() == [0.0, 1.0, 1.0]


def test_single_sample_validation_reports_only_mean():
    from rlvr.trainer.metrics import validation_metrics

    m = validation_metrics(["s", "s"], ["a", "b"], [1, 0], ["1", "2"])
    assert m == {"val-core/s/reward/mean@1": 0.5}


def _diff_batch(rollout_log_probs, old_log_probs):
    mask = torch.ones(1, len(old_log_probs), dtype=torch.long)
    zeros = torch.zeros(1, len(old_log_probs))
    return DataProto.from_dict({"rollout_log_probs": torch.tensor([rollout_log_probs]),
                                "old_log_probs": torch.tensor([old_log_probs]), "response_mask": mask,
                                "attention_mask": torch.cat([torch.ones(1, 2, dtype=torch.long), mask], 1),
                                "responses": torch.zeros(1, len(old_log_probs), dtype=torch.long),
                                "token_level_scores": zeros, "token_level_rewards": zeros, "advantages": zeros,
                                "returns": zeros})


def test_the_rollout_diff_measures_the_engine_against_the_actor_in_log_probs():
    """A token the engine gives 2 nats more than the actor, at p = 1e-5 (a random tiny model's
    tokens all lie near 1/V): |p_rollout - p_actor| = 1e-5 (e^2 - 1) = 6.4e-5, which reads 0.0 to
    four decimals; |log p_rollout - log p_actor| = 2 reads the gap itself. Token 0 agrees (p 0.5)."""
    low = math.log(1e-5)
    m = compute_data_metrics(_diff_batch([math.log(0.5), low + 2.0], [math.log(0.5), low]), 2, 2)
    assert m["training/rollout_probs_diff_max"] == pytest.approx(1e-5 * (math.e ** 2 - 1), rel=1e-4)
    assert m["training/rollout_log_probs_diff_max"] == pytest.approx(2.0, abs=1e-5)
    assert m["training/rollout_log_probs_diff_mean"] == pytest.approx(1.0, abs=1e-5)  # (0 + 2) / 2


def test_no_rollout_diff_when_pi_old_is_the_rollouts_own():
    """Bypass mode copies rollout_log_probs into old_log_probs: a diff of the two is 0.0 whatever
    the engine does, so it is not reported as if it measured the engine."""
    batch = _diff_batch([-1.0, -2.0], [-1.0, -2.0])
    batch.meta_info["old_log_probs_source"] = "rollout"
    assert not any("diff" in key for key in compute_data_metrics(batch, 2, 2))
