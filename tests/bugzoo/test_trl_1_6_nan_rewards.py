"""TRL 1.6 (https://github.com/huggingface/trl/pull/5902, after #5773): a completion whose every
reward function returned None/NaN was collapsed to 0.0 by ``nansum``; that fake 0 biased its
group's baseline and the unscorable completion got a real advantage, so the policy was trained
away from text nobody had scored.

Here one training step on the tiny model with a reward function that scores the 6 samples (2
prompts x 3) in order 1, 0, 0 | NaN, 1, 0: the second group carries no loss, the first keeps the
advantages of its own scores, the NaN is counted; with reward.on_invalid=raise the step stops,
naming the sample and its data source.
"""

import json
from pathlib import Path

import pytest
import torch

from rlvr.protocol import loss_mask
from rlvr.rewards import RewardError
from rlvr.trainer.main import build_trainer

SCRIPTED = '''
SCORES = iter([1.0, 0.0, 0.0, float("nan"), 1.0, 0.0])  # rows in order: prompt 0 x 3, prompt 1 x 3


def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    return next(SCORES)
'''

ONE_STEP = ["trainer.total_training_steps=1", "trainer.val_before_train=false", "data.val_files=[]",
            "reward.num_workers=0", "algorithm.adv_estimator=grpo"]


@pytest.fixture
def scripted_config(tiny_config, tmp_path):
    reward = tmp_path / "scripted_reward.py"
    reward.write_text(SCRIPTED)
    return lambda *overrides: tiny_config(*ONE_STEP, f"reward.custom_reward_function.path={reward}", *overrides)


def test_a_group_with_a_nan_reward_carries_no_loss_and_the_others_keep_their_advantages(scripted_config):
    """fails when the trainer's ``_drop_groups`` call in ``_attach_scores`` (rlvr/trainer/ppo_trainer.py)
    is removed, or the reward manager gives a NaN a score instead of marking it invalid."""
    trainer = build_trainer(scripted_config(), progress_bar=False)
    seen = {}
    update_actor = trainer.wg.update_actor

    def record(batch):
        seen["advantages"], seen["loss_mask"] = batch.batch["advantages"].clone(), loss_mask(batch).clone()
        return update_actor(batch)

    trainer.wg.update_actor = record
    trainer.fit()
    trainer.tracker.close()

    rows_with_loss = seen["loss_mask"].sum(-1) > 0  # (6,)
    assert rows_with_loss.tolist() == [True] * 3 + [False] * 3  # the NaN's whole group is out
    # group 0 scores 1, 0, 0: mean 1/3, unbiased std sqrt((4/9 + 1/9 + 1/9) / 2) = sqrt(1/3) = 0.57735;
    # (1 - 1/3) / 0.57735 = 1.15470, (0 - 1/3) / 0.57735 = -0.57735 (on every token of the response)
    first_token = seen["advantages"][:3, 0]
    torch.testing.assert_close(first_token, torch.tensor([1.15470, -0.57735, -0.57735]), atol=1e-4, rtol=0)
    record = json.loads(open(Path(trainer.config.trainer.default_local_dir) / "metrics.jsonl").readline())
    assert record["reward/num_invalid"] == 1.0 and record["reward/num_invalid/arithmetic"] == 1.0
    assert record["training/dropped_groups"] == 1.0


def test_a_dropped_group_does_not_shift_a_batch_whitened_estimator(scripted_config):
    """REINFORCE++ whitens returns over the batch's tokens: the dropped group's placeholder scores
    (reward.failure_score = -7 here) must not enter the mean and std. Over the kept group's tokens
    alone (scores 1, 0, 0 on responses of L0, L1, L2 tokens, gamma 1: every token's return is its
    row's score): mean m = L0 / (L0 + L1 + L2), var v = sum_i L_i (s_i - m)^2 / (L - 1) (unbiased, as
    verl's masked_var), advantage (s - m) / sqrt(v + 1e-8): positive for the right answer,
    negative for the two wrong ones. With the placeholders in the batch (three rows at -7) the
    mean falls below 0 and the wrong answers' advantages turn positive.

    fails when ``RLTrainer._advantages`` runs the estimator over the dropped groups too."""
    trainer = build_trainer(scripted_config("algorithm.adv_estimator=reinforce_plus_plus",
                                            "reward.failure_score=-7"), progress_bar=False)
    seen = {}
    update_actor = trainer.wg.update_actor

    def record(batch):
        seen["advantages"], seen["mask"] = batch.batch["advantages"].clone(), batch.batch["response_mask"].clone()
        return update_actor(batch)

    trainer.wg.update_actor = record
    trainer.fit()
    trainer.tracker.close()
    lengths = seen["mask"][:3].sum(-1).double()
    scores = torch.tensor([1.0, 0.0, 0.0], dtype=torch.float64)
    mean = (lengths * scores).sum() / lengths.sum()
    var = (lengths * (scores - mean) ** 2).sum() / (lengths.sum() - 1)
    expected = (scores - mean) / torch.sqrt(var + 1e-8)
    torch.testing.assert_close(seen["advantages"][:3, 0].double(), expected, atol=1e-4, rtol=0)
    assert expected[0] > 0 > expected[1]
    assert seen["advantages"][3:].abs().max() == 0  # the dropped group: no advantage at all


def test_on_invalid_raise_stops_the_step_naming_the_sample(scripted_config):
    """fails when ``reward.on_invalid=raise`` is not honoured (the ``raise RewardError`` in
    ``RewardManager._collect``, rlvr/rewards/manager.py)."""
    trainer = build_trainer(scripted_config("reward.on_invalid=raise"), progress_bar=False)
    with pytest.raises(RewardError, match=r"reward for sample 3 \(data_source='arithmetic'.*is not a number: "
                                          r"reward function .* returned nan"):
        trainer.fit()
    trainer.tracker.close()
