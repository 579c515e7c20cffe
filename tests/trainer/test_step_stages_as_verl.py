"""Stages of a step that must see what verl's see, on hand-made batches (no model):

- rollout correction's rejection narrows the mask the advantage estimator sees, as verl narrows
  ``response_mask`` (``compute_rollout_correction_and_add_to_batch``) before ``compute_advantage``;
- ReMax's greedy baseline is scored as the samples are: with the reward model's score when there is one;
- the objective card says how SAPO (and GSPO, GMPO) aggregate."""

import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from rlvr.config import load_config
from rlvr.protocol import DataProto, loss_mask
from rlvr.rewards.manager import RewardResult, place_on_last_token
from rlvr.trainer.explain import objective_card
from rlvr.trainer.ppo_trainer import RLTrainer

# three samples of one prompt, T = 4: a reward of 1 on row 0's last token and on row 2's (token 2)
SCORES = torch.tensor([[0.0, 0.0, 0.0, 1.0], [0.0, 0.0, 0.0, 0.0], [0.0, 0.0, 1.0, 0.0]])
MASK = torch.tensor([[1.0, 1.0, 1.0, 1.0], [1.0, 1.0, 1.0, 1.0], [1.0, 1.0, 1.0, 0.0]])


def rejected_batch(estimator: str):
    """The batch after the old-log-prob pass, and a trainer stand-in: pi_old / pi_rollout is 3 at row 0's
    token 2 and 1 elsewhere, so token_k1 at threshold 2 (k1 = -ln 3 < ln 1/2) rejects that token alone."""
    cfg = load_config(None, [f"algorithm.adv_estimator={estimator}", "actor_rollout_ref.rollout.n=3",
                             "data.train_batch_size=1", "actor_rollout_ref.actor.ppo_mini_batch_size=1",
                             "algorithm.rollout_correction.rollout_rs=token_k1",
                             "algorithm.rollout_correction.rollout_rs_threshold=2.0"])
    rollout = torch.full((3, 4), -1.0)
    old = rollout.clone()
    old[0, 2] += math.log(3.0)
    batch = DataProto.from_dict(
        {"response_mask": MASK.clone(), "attention_mask": torch.cat([torch.ones(3, 2), MASK], dim=1).long(),
         "token_level_scores": SCORES.clone(), "old_log_probs": old, "rollout_log_probs": rollout},
        {"uid": np.array(["a", "a", "a"], dtype=object)})
    return batch, SimpleNamespace(config=cfg, kl_ctrl=None, global_step=1)


def advantages_after_rejection(estimator: str) -> tuple[torch.Tensor, DataProto]:
    batch, trainer = rejected_batch(estimator)
    RLTrainer._correct_rollout(trainer, batch)
    RLTrainer._advantages(trainer, batch)
    return batch.batch["advantages"], batch


def test_reinforce_plus_plus_sees_the_rejected_token_as_verl():
    # verl's returns (gamma 1) over the narrowed mask: row 0 [0, 0, 1, 1] (the rejected token 2 cuts the
    # chain, so tokens 0-1 get nothing), row 1 [0, 0, 0, 0], row 2 [1, 1, 1, -]; whitened over the 10 kept
    # tokens (row 0's 0, 1, 3; all of row 1; row 2's 0-2): values 0,0,1, 0,0,0,0, 1,1,1 -> mean 0.4,
    # unbiased var (4 * 0.36 + 6 * 0.16) / 9 = 0.26667, std 0.5164: 0 -> -0.7746, 1 -> +1.1619
    # (before: the full mask, returns [1, 1, 1, 1] on row 0, whitened over 11 tokens: +0.7207 on tokens 0-1)
    adv, batch = advantages_after_rejection("reinforce_plus_plus")
    low, high = -0.4 / math.sqrt(2.4 / 9), 0.6 / math.sqrt(2.4 / 9)
    assert low == pytest.approx(-0.7746, abs=1e-4) and high == pytest.approx(1.1619, abs=1e-4)
    expected = torch.tensor([[low, low, 0.0, high], [low, low, low, low], [high, high, high, 0.0]])
    assert torch.allclose(adv, expected, atol=1e-5)
    # rlvr keeps response_mask as the sampled tokens; the update's loss mask carries the rejection
    assert torch.equal(batch.batch["response_mask"], MASK)
    assert loss_mask(batch)[0].tolist() == [1.0, 1.0, 0.0, 1.0]


def test_reinforce_plus_plus_baseline_whitens_over_the_kept_tokens():
    # scores 1, 0, 1 minus the group mean 2/3: 1/3, -2/3, 1/3 on each kept token (3, 4 and 3 tokens);
    # mean (6 * 1/3 - 4 * 2/3) / 10 = -1/15 -> deviations 0.4 and -0.6, unbiased var 2.4 / 9 as above
    adv, _ = advantages_after_rejection("reinforce_plus_plus_baseline")
    pos, neg = 0.4 / math.sqrt(2.4 / 9), -0.6 / math.sqrt(2.4 / 9)  # 0.7746, -1.1619
    assert torch.allclose(adv, torch.tensor([[pos, pos, 0.0, pos], [neg] * 4, [pos, pos, pos, 0.0]]), atol=1e-5)


def test_opo_weighs_by_the_kept_lengths():
    # lengths 3 (row 0 less its rejected token), 4, 3: baseline (3 * 1 + 4 * 0 + 3 * 1) / 10 = 0.6
    # -> 0.4, -0.6, 0.4 (before: lengths 4, 4, 3 -> 7 / 11, advantages 0.3636, -0.6364, 0.3636)
    adv, _ = advantages_after_rejection("opo")
    assert adv[:, 0].tolist() == pytest.approx([0.4, -0.6, 0.4], abs=1e-6)
    assert adv[0, 2].item() == 0.0  # the rejected token carries none


# ------------------------------------------------------------------ ReMax's greedy baseline
class GreedyEngine:
    """Returns a two-token response for each prompt it is sent."""

    def generate_sequences(self, batch: DataProto) -> DataProto:
        k = len(batch)
        return DataProto.from_dict({"responses": torch.full((k, 2), 7), "response_mask": torch.ones(k, 2),
                                    "input_ids": torch.full((k, 5), 7), "attention_mask": torch.ones(k, 5).long()})


def rule_scorer(data: DataProto) -> RewardResult:
    """Every response scores 1 by the rule."""
    ones = torch.ones(len(data))
    return RewardResult(place_on_last_token(ones, data.batch["response_mask"]), scores=ones)


class StandInRewardModel:
    """Scores every response 0.25 and records what it was given."""

    def __init__(self):
        self.seen = []

    def compute_rm_score(self, data: DataProto) -> DataProto:
        self.seen.append(data)
        scores = torch.full((len(data),), 0.25)
        return DataProto.from_dict({"rm_scores": place_on_last_token(scores, data.batch["response_mask"])})


@pytest.mark.parametrize("add_rule_scores, expected", [(False, 0.5), (True, 1.5)])
def test_remax_greedy_baseline_is_scored_as_the_samples_are(add_rule_scores, expected):
    # the samples' score with a reward model: weight 2 x its 0.25 = 0.5 (verl's: the model's alone), or the
    # rule's 1 + 0.5 = 1.5 with add_rule_scores; the baseline was the rule's 1.0 in both cases before
    cfg = load_config(None, ["algorithm.adv_estimator=remax", "actor_rollout_ref.rollout.n=2",
                             "reward.reward_model.enable=true", "reward.reward_model.path=/stand-in",
                             "reward.reward_model.weight=2.0",
                             f"reward.reward_model.add_rule_scores={add_rule_scores}"])
    trainer = RLTrainer.__new__(RLTrainer)  # the stages this test needs, without models
    model = StandInRewardModel()
    trainer.config, trainer.global_step, trainer.rollout_wg = cfg, 1, GreedyEngine()
    trainer.reward_fn, trainer.reward_model = rule_scorer, model
    prompts = DataProto.from_dict({"input_ids": torch.full((4, 3), 7)}, {
        "data_source": np.array(["t"] * 4, dtype=object), "uid": np.array(["p", "p", "q", "q"], dtype=object),
        "reward_model": np.array([{"ground_truth": "1"}] * 4, dtype=object)})
    baselines = trainer._greedy_baselines(prompts, prompts)
    assert baselines.tolist() == pytest.approx([expected] * 4)
    assert len(model.seen) == 1 and len(model.seen[0]) == 2  # the two prompts' greedy responses, once each
    assert torch.equal(model.seen[0].batch["responses"], torch.full((2, 2), 7))


# ------------------------------------------------------------------ the objective card
@pytest.mark.parametrize("loss_mode", ["sapo", "gspo"])
def test_the_card_says_sapo_and_gspo_aggregate_per_sequence(loss_mode):
    card = objective_card(load_config(None, [f"actor_rollout_ref.actor.policy_loss.loss_mode={loss_mode}"]))
    line = next(line for line in card.splitlines() if line.startswith("policy loss:"))
    assert "aggregated seq-mean-token-mean whatever loss_agg_mode says" in line, line
    assert "token-mean aggregates the entropy and KL terms" in line
