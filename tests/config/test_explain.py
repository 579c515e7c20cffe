"""``rlvr train --explain``: each shipped recipe's card is checked in (tests/config/golden/), and
each warning has a config that triggers it and a recipe where it stays quiet."""

from pathlib import Path

import pytest

from rlvr.cli import main
from rlvr.config import load_config
from rlvr.trainer.explain import objective_card

GOLDEN = Path(__file__).parent / "golden"


@pytest.mark.parametrize("recipe", ["grpo", "dapo", "calculator", "gsm8k_zh"])
def test_each_recipe_card_is_the_checked_in_one(recipe, capsys):
    assert main(["train", "--config", recipe, "--explain"]) in (0, None)
    assert capsys.readouterr().out == (GOLDEN / f"explain_{recipe}.txt").read_text()


def test_the_card_reads_the_batch_arithmetic():
    # 16 prompts, mini-batches of 4 -> 4 mini-batches x 2 epochs = 8 optimizer steps
    card = objective_card(load_config(None, ["data.train_batch_size=16", "actor_rollout_ref.actor.ppo_mini_batch_size=4",
                                             "actor_rollout_ref.actor.ppo_epochs=2", "actor_rollout_ref.rollout.n=4"]))
    assert "16 prompts x n=4 = 64 rows a step; 4 mini-batch(es) of 4 prompts x 2 epoch(s) = 8 optimizer step(s)" in card
    assert "8 optimizer steps per rollout, the first on-policy, the last 7 update(s) past pi_old" in card
    dr = objective_card(load_config(None, ["algorithm.norm_adv_by_std_in_grpo=false"]))
    assert "r - group mean (Dr.GRPO)" in dr and "algorithm.norm_adv_by_std_in_grpo=False (verl True)" in dr


WARNINGS = [
    (["algorithm.use_kl_in_reward=true"], "the KL to the reference is applied twice"),
    (["actor_rollout_ref.actor.ppo_epochs=2", "trainer.v1.trainer_mode=colocate_async"],
     "off-policy sources stack: 2 updates per rollout on samples already 1 update(s) stale"),
    (["trainer.v1.trainer_mode=colocate_async"], "samples 1 update(s) stale and no rollout correction"),
    (["actor_rollout_ref.rollout.top_p=0.9"], "truncated sampling (top_p=0.9)"),
    (["actor_rollout_ref.actor.use_kl_loss=false", "actor_rollout_ref.actor.kl_loss_coef=0.1"],
     "actor_rollout_ref.actor.kl_loss_coef is set but has no effect: actor.use_kl_loss is false"),
    (["algorithm.kl_ctrl.kl_coef=0.05"], "algorithm.kl_ctrl.kl_coef is set but has no effect"),
    (["algorithm.adv_estimator=rloo", "algorithm.norm_adv_by_std_in_grpo=false"],
     "algorithm.norm_adv_by_std_in_grpo is set but has no effect: the rloo estimator does not read it"),
    (["actor_rollout_ref.actor.policy_loss.loss_mode=gspo", "actor_rollout_ref.actor.clip_ratio_c=5"],
     "actor_rollout_ref.actor.clip_ratio_c is set but has no effect: dual clip belongs to the vanilla loss"),
    (["algorithm.gamma=0.9"], "algorithm.gamma / algorithm.lam is set but has no effect"),
    (["data.val_files=[]"], "trainer.test_freq / trainer.val_before_train is set but has no effect: data.val_files is "
                            "empty (no validation runs)"),
]


@pytest.mark.parametrize("overrides, warning", WARNINGS)
def test_each_warning_has_a_config_that_triggers_it(overrides, warning):
    card = objective_card(load_config(None, overrides))
    assert f"! {warning}" in card


def test_the_default_job_card_has_no_warning():
    assert "\n!" not in "\n" + objective_card(load_config(None, []))


def test_rollout_correction_is_on_the_card():
    card = objective_card(load_config(None, ["algorithm.rollout_correction.rollout_is=token",
                                             "algorithm.rollout_correction.rollout_rs=seq_mean_k1",
                                             "algorithm.rollout_correction.rollout_rs_threshold=0.9_1.1"]))
    assert "importance sampling: pi_old / pi_rollout, token weights at 2.0, rejection seq_mean_k1 at 0.9_1.1" in card
    bypass = objective_card(load_config(None, ["algorithm.rollout_correction.bypass_mode=true"]))
    assert "bypass mode, pi_old = the rollout's log-probs (ppo_clip)" in bypass


def test_the_card_gives_the_token_budget_under_dynamic_batch_size():
    # use_dynamic_bsz: micro-batches are cut by tokens, so a row count would be a number rlvr never uses
    card = objective_card(load_config(None, ["actor_rollout_ref.actor.use_dynamic_bsz=true",
                                             "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=4096"]))
    assert "micro-batches of up to 4096 tokens per device (use_dynamic_bsz)" in card
    assert "rows per device" not in card
    assert "micro-batches of 16 rows per device" in objective_card(load_config(None, []))


def test_the_card_says_what_the_gradient_clip_does():
    """grad_clip was on no card: a user could not see that 1.0 rescales any step whose global
    gradient norm passes 1 (the console's grad_norm is the norm before that), or that .inf is off."""
    card = objective_card(load_config(None, ["actor_rollout_ref.actor.grad_clip=0.5"]))
    assert ("gradient clip: each optimizer step scales the gradients by min(1, 0.5 / global norm), so no step's "
            "norm passes 0.5 (grad_norm is logged before the clip)") in card
    off = objective_card(load_config(None, ["actor_rollout_ref.actor.grad_clip=.inf"]))
    assert "gradient clip: none (grad_clip=inf)" in off


def test_distillation_is_on_the_card():
    """The distillation term and how it joins the loss: alone, the policy loss line is not what trains."""
    teacher = "distillation.teacher_models.teacher_model.model_path=builtin"
    card = objective_card(load_config("distill", [teacher]))  # the recipe: beside the task reward's loss
    assert ("distillation: forward_kl_topk over the teacher's top 32 tokens, aggregated token-mean; added to the "
            "policy loss x 1.0; teacher default: builtin") in card
    card = objective_card(load_config("distill", [teacher, "distillation.distillation_loss.use_task_rewards=false"]))
    assert ("distillation: forward_kl_topk over the teacher's top 32 tokens, aggregated token-mean; the whole loss: "
            "the policy loss above is not trained (use_task_rewards=false); teacher default: builtin") in card
    card = objective_card(load_config(None, ["distillation.enabled=true", teacher,
                                             "distillation.distillation_loss.loss_mode=k1",
                                             "distillation.distillation_loss.use_policy_gradient=true",
                                             "distillation.distillation_loss.loss_max_clamp=10"]))
    assert ("distillation: k1 of each sampled token's log-probs, as a per-token advantage (-loss) in a PPO clip "
            "[0.80, 1.20], each clamped to +-10.0; added to the policy loss x 1.0; teacher default: builtin") in card
    assert "distillation" not in objective_card(load_config(None, []))
