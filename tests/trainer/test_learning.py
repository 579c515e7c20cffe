"""End-to-end behaviour a wrong implementation gets wrong: the reward rises on a learnable toy
task, the entropy bonus raises entropy, several epochs and mini-batches move the policy away
from pi_old, bf16 training keeps the bf16 rollout copy in sync, and the on-policy shortcut is
on exactly when pi_old is the policy being trained."""

import math

import pytest
import torch

from rlvr.trainer.main import build_trainer
from rlvr.trainer.ppo_trainer import needs_old_log_prob_pass

LEADING_SPACE = '''
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    """1 when the response starts with a space: about half the random tiny model's first tokens do."""
    return float(solution_str.startswith(" "))
'''

CONSTANT = '''
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    return 1.0
'''


def records_of(trainer):
    import json
    from pathlib import Path
    return [json.loads(line) for line in open(Path(trainer.config.trainer.default_local_dir) / "metrics.jsonl")]


def train(tiny_config, tmp_path, reward_text, *overrides):
    tmp_path.mkdir(parents=True, exist_ok=True)
    reward = tmp_path / "reward.py"
    reward.write_text(reward_text)
    trainer = build_trainer(tiny_config(f"reward.custom_reward_function.path={reward}", "trainer.val_before_train=false",
                                        "data.val_files=[]", *overrides), progress_bar=False)
    trainer.fit()
    trainer.tracker.close()
    return trainer, records_of(trainer)


SPACE_SHARE = '''
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    """The share of the response's characters that are spaces (~0.1 for the random tiny model)."""
    return sum(c == " " for c in solution_str) / max(1, len(solution_str))
'''
# top-k 8: the random tiny model's near-uniform 49k-token distribution leaves each step a choice
# among 8 tokens, so a few updates can change which ones win
LEARN = ("actor_rollout_ref.rollout.n=8", "actor_rollout_ref.rollout.top_k=8", "actor_rollout_ref.actor.ppo_mini_batch_size=2",
         "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=16", "actor_rollout_ref.actor.use_kl_loss=false")


def test_reward_rises_on_a_learnable_toy_task(tiny_config, tmp_path):
    """GRPO on the tiny model: the share of responses starting with a space goes from about 0.7
    to all of them within 6 steps (a flipped advantage sign would push it down, a broken gradient
    leave it where it starts)."""
    _, records = train(tiny_config, tmp_path, LEADING_SPACE, *LEARN, "actor_rollout_ref.actor.optim.lr=1e-1",
                       "trainer.total_training_steps=6")
    scores = [r["critic/score/mean"] for r in records]
    assert scores[0] < 0.8, scores
    assert scores[-2:] == [1.0, 1.0], scores


def test_reward_rises_with_the_vllm_engine(tiny_config, tmp_path, tiny_vllm_model_dir):
    """The same task with rollout.name=vllm: vLLM samples (its weights streamed from the actor
    before every rollout), so a stale engine would keep sampling the first policy and the share
    would stay where it starts."""
    _, records = train(tiny_config, tmp_path, LEADING_SPACE, *LEARN, "actor_rollout_ref.actor.optim.lr=1e-1",
                       "trainer.total_training_steps=6", f"actor_rollout_ref.model.path={tiny_vllm_model_dir}",
                       "actor_rollout_ref.rollout.name=vllm")
    scores = [r["critic/score/mean"] for r in records]  # measured: 0.31, 0.81, 0.44, 0.81, 1.0, 0.94
    assert scores[0] < 0.5, scores
    assert min(scores[-2:]) >= 0.9, scores


def test_vllm_on_a_sharded_actor_equals_the_local_actor(tiny_config, tmp_path, tiny_vllm_model_dir):
    """actor.strategy=fsdp2 (one rank): vLLM's weights come gathered from the shards, parameter by
    parameter; the run equals the unsharded one step for step (wrongly gathered or stale weights
    would sample other tokens)."""
    runs = {}
    for strategy in ("local", "fsdp2"):
        _, records = train(tiny_config, tmp_path / strategy, SPACE_SHARE, *LEARN, "actor_rollout_ref.actor.optim.lr=3e-2", "trainer.total_training_steps=3",
                           f"actor_rollout_ref.model.path={tiny_vllm_model_dir}", "actor_rollout_ref.rollout.name=vllm",
                           f"actor_rollout_ref.actor.strategy={strategy}",
                           f"trainer.default_local_dir={tmp_path / strategy / 'run'}")
        runs[strategy] = [(r["critic/score/mean"], r["response_length/mean"], r["actor/pg_loss"]) for r in records]
    assert len(runs["local"]) == 3 and len({s for s, _, _ in runs["local"]}) > 1  # the policy moved
    for a, b in zip(runs["local"], runs["fsdp2"]):
        assert a[:2] == b[:2] and abs(a[2] - b[2]) < 1e-4, runs


def test_entropy_bonus_raises_entropy(tiny_config, tmp_path):
    """Learning the share of spaces concentrates the policy and lowers its entropy; the same run
    with an entropy bonus ends with a higher entropy (a bonus with the wrong sign would end lower)."""
    entropy = {}
    for coeff in (0.0, 0.05):
        _, records = train(tiny_config, tmp_path / str(coeff), SPACE_SHARE, *LEARN, "actor_rollout_ref.actor.optim.lr=3e-2",
                           f"actor_rollout_ref.actor.entropy_coeff={coeff}", "trainer.total_training_steps=6",
                           f"trainer.default_local_dir={tmp_path / str(coeff) / 'run'}")
        entropy[coeff] = [r["actor/entropy"] for r in records]
    assert entropy[0.0][-1] < entropy[0.0][0] - 1.0  # learning the task lowers entropy
    assert entropy[0.05][-1] > entropy[0.0][-1] + 1.0, entropy


def test_several_epochs_and_mini_batches_move_away_from_pi_old(tiny_config, tmp_path):
    """ppo_epochs = 2 over 2 mini-batches: 4 optimizer steps per batch; after the first, the ratio
    differs from 1, so ppo_kl and the clip fraction are non-zero (all zero would mean pi_old was
    recomputed every time, or the update never happened)."""
    from tests.trainer.conftest import REWARD_FILE
    trainer, records = train(tiny_config, tmp_path, REWARD_FILE, "actor_rollout_ref.actor.ppo_epochs=2",
                             "actor_rollout_ref.actor.ppo_mini_batch_size=1", "actor_rollout_ref.actor.optim.lr=3e-2",
                             "actor_rollout_ref.actor.clip_ratio=0.05")
    assert trainer.separate_old_log_prob
    for r in records:
        assert math.isfinite(r["actor/ppo_kl"]) and r["actor/ppo_kl"] != 0.0
        assert 0.0 < r["actor/pg_clipfrac"] <= 1.0
        assert "timing_s/old_log_prob" in r


def test_bf16_actor_and_rollout_resync_after_each_update(tiny_config, tmp_path):
    from tests.trainer.conftest import REWARD_FILE
    from rlvr.trainer.evaluate import generation_batch
    import numpy as np

    reward = tmp_path / "reward.py"
    reward.write_text(REWARD_FILE)
    trainer = build_trainer(tiny_config(f"reward.custom_reward_function.path={reward}", "actor_rollout_ref.actor.dtype=bfloat16",
                                        "actor_rollout_ref.rollout.dtype=bfloat16", "actor_rollout_ref.actor.optim.lr=5e-2",
                                        "trainer.val_before_train=false", "data.val_files=[]",
                                        "trainer.total_training_steps=1"), progress_bar=False)
    worker = trainer.wg.worker
    assert worker.rollout.model is not worker.model and next(worker.rollout.model.parameters()).dtype == torch.bfloat16
    prompts = next(iter(trainer.loader))
    prompts.non_tensor_batch["uid"] = np.array(["a", "b"], dtype=object)
    gen = generation_batch(prompts)
    gen.meta_info.update(seed=7)
    before = worker.generate_sequences(gen).batch["rollout_log_probs"]
    trainer.fit()
    trainer.tracker.close()
    assert math.isfinite(records_of(trainer)[0]["actor/pg_loss"])
    after = worker.generate_sequences(gen).batch["rollout_log_probs"]
    for copy, actor in zip(worker.rollout.model.parameters(), worker.model.parameters()):
        assert torch.equal(copy, actor.to(torch.bfloat16))  # synced when generation starts
    assert not torch.equal(before, after)  # the update reached the rollout copy: same seed, other log-probs


@pytest.mark.parametrize("overrides, separate", [
    ((), False),  # one optimizer step per batch, nothing reads old_log_probs first: taken from the update
    (("actor_rollout_ref.actor.ppo_epochs=2",), True),
    (("actor_rollout_ref.actor.ppo_mini_batch_size=1",), True),
    (("algorithm.use_kl_in_reward=true",), True),
    (("algorithm.rollout_is=true",), True),  # rlvr's older spelling of rollout_correction.rollout_is=token
    (("algorithm.rollout_correction.rollout_rs=token_k3", "algorithm.rollout_correction.rollout_rs_threshold=0.1"), True),
    (("algorithm.rollout_correction.bypass_mode=true", "actor_rollout_ref.actor.ppo_epochs=2"), False),  # pi_old = pi_rollout
    (("actor_rollout_ref.actor.recompute_old_log_prob=true",), True),
])
def test_on_policy_shortcut_switches_on_and_off(tiny_config, overrides, separate):
    config = tiny_config("actor_rollout_ref.actor.ppo_mini_batch_size=2", *overrides)
    assert needs_old_log_prob_pass(config) is separate
