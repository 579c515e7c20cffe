"""Actor: micro-batching, the LR schedule, first-step invariants, split invariance, NaN skipping."""

import math

import numpy as np
import pytest
import torch

from rlvr.config.schema import ActorConfig, OptimConfig
from rlvr.models import load_model
from rlvr.workers.actor import Actor, build_optimizer, micro_batches


def test_micro_batches_by_count_and_by_tokens():
    units = [[0, 1], [2, 3], [4, 5]]  # three groups of two rows
    assert micro_batches(units, [10, 20, 30], rows_per_micro=4, token_budget=None) == [[0, 1, 2, 3], [4, 5]]
    assert micro_batches(units, [10, 20, 30], rows_per_micro=1, token_budget=None) == [[0, 1], [2, 3], [4, 5]]
    # budget 35: 10 + 20 = 30 fits, + 30 would be 60; the last unit alone
    assert micro_batches(units, [10, 20, 30], rows_per_micro=1, token_budget=35) == [[0, 1, 2, 3], [4, 5]]
    # a unit over the budget goes alone rather than being dropped
    assert micro_batches(units, [50, 5, 5], rows_per_micro=1, token_budget=20) == [[0, 1], [2, 3, 4, 5]]


def test_lr_schedule_warmup_then_cosine():
    model = torch.nn.Linear(2, 2)
    optim = OptimConfig(lr=1.0, lr_warmup_steps=2, warmup_style="cosine", min_lr_ratio=0.1)
    opt, sched = build_optimizer(model, optim, total_steps=6)
    lrs = []
    for _ in range(6):
        lrs.append(sched.get_last_lr()[0])
        opt.step()
        sched.step()
    # verl's get_cosine_schedule_with_warmup: warmup s / warmup = 0/2, 1/2; then cosine over 4 steps:
    # 0.1 + 0.9 * 0.5 (1 + cos(pi p)), p = 0, .25, .5, .75
    expected = [0.0, 0.5, 1.0, 0.1 + 0.45 * (1 + math.cos(math.pi / 4)), 0.55, 0.1 + 0.45 * (1 - math.cos(math.pi / 4))]
    assert lrs == pytest.approx(expected)


def test_lr_schedule_constant_warmup_is_verls():
    """verl's get_constant_schedule_with_warmup: step / warmup during warmup, then 1, so the
    first step runs at lr 0; without warmup the first step has the full lr."""
    model = torch.nn.Linear(2, 2)
    opt, sched = build_optimizer(model, OptimConfig(lr=1.0, lr_warmup_steps=10), total_steps=20)
    lrs = []
    for _ in range(12):
        lrs.append(sched.get_last_lr()[0])
        opt.step()
        sched.step()
    # 0/10, 5/10, then 10/10 and constant
    assert (lrs[0], lrs[5], lrs[10], lrs[11]) == pytest.approx((0.0, 0.5, 1.0, 1.0))
    # lr_warmup_steps_ratio 0.25 of 8 steps = int(2.0) = 2 warmup steps: 0, 0.5, 1
    opt, sched = build_optimizer(model, OptimConfig(lr=1.0, lr_warmup_steps_ratio=0.25), total_steps=8)
    lrs = []
    for _ in range(3):
        lrs.append(sched.get_last_lr()[0])
        opt.step()
        sched.step()
    assert lrs == pytest.approx([0.0, 0.5, 1.0])
    _, sched = build_optimizer(model, OptimConfig(lr=1.0), total_steps=8)
    assert sched.get_last_lr()[0] == 1.0  # no warmup (verl's default): the first step at the full lr


def test_adamw_step_is_fused_and_exact():
    """The optimizer is PyTorch's fused AdamW on CPU and its step is AdamW's, by hand.

    lr 0.1, betas (0.9, 0.999), eps 1e-8, weight decay 0.5, w = [1, -2], g = [0.5, -4]:
    decay first, w <- w (1 - lr wd) = [0.95, -1.9]; m = 0.1 g = [0.05, -0.4], v = 0.001 g^2 =
    [0.00025, 0.016]; bias-corrected m^ = g, v^ = g^2, so the step is lr g / (|g| + eps) = ±0.1
    (to 1e-7): w = [0.85, -1.8]."""
    model = torch.nn.Linear(2, 1, bias=False)
    model.weight.data = torch.tensor([[1.0, -2.0]])
    opt, _ = build_optimizer(model, OptimConfig(lr=0.1, weight_decay=0.5), total_steps=1)
    assert opt.param_groups[0]["fused"] is True
    model.weight.grad = torch.tensor([[0.5, -4.0]])
    opt.step()
    assert model.weight.data[0].tolist() == pytest.approx([0.85, -1.8], abs=1e-6)
    # a parameter the fused kernel does not take (an integer buffer made trainable cannot be, so a
    # meta-device one stands in) keeps the default implementation rather than failing
    meta = torch.nn.Linear(2, 1, device="meta")
    opt, _ = build_optimizer(meta, OptimConfig(), total_steps=1)
    assert not opt.param_groups[0]["fused"]


def make_actor(model_dir, algorithm=None, **overrides):
    model = load_model(model_dir)
    settings = dict(ppo_mini_batch_size=2, ppo_micro_batch_size_per_gpu=6, use_kl_loss=True, kl_loss_coef=0.1,
                    entropy_coeff=0.01)
    cfg = ActorConfig(**{**settings, **overrides})
    opt, sched = build_optimizer(model, OptimConfig(lr=1e-3), total_steps=10)
    return Actor(model, cfg, algorithm, optimizer=opt, scheduler=sched, pad_id=0, max_response_length=7)


def with_training_keys(actor, batch):
    batch.meta_info["micro_batch_size"] = 6
    old, _ = actor.compute_log_prob(batch)
    batch.batch["old_log_probs"] = old
    batch.batch["ref_log_prob"] = old.clone()
    adv = torch.tensor([1.0, -0.5, -0.5, 0.7, 0.7, -1.4])[:, None] * batch.batch["response_mask"]
    batch.batch["advantages"] = adv
    return batch


def test_first_step_invariants(batch, tiny_model_dir):
    """One epoch, one mini-batch: the update's forward reproduces old_log_probs, so ppo_kl = 0,
    nothing is clipped, and the KL to an identical reference is 0."""
    actor = make_actor(tiny_model_dir)
    batch = with_training_keys(actor, batch)
    before = [p.detach().clone() for p in actor.model.parameters()]
    metrics = actor.update_policy(batch)
    assert abs(metrics["actor/ppo_kl"]) < 1e-6
    assert metrics["actor/pg_clipfrac"] == 0.0
    assert abs(metrics["actor/kl_loss"]) < 1e-6
    assert math.isfinite(metrics["actor/pg_loss"]) and metrics["actor/grad_norm"] > 0
    assert metrics["actor/lr"] == pytest.approx(1e-3)
    changed = [not torch.equal(a, p) for a, p in zip(before, actor.model.parameters())]
    assert any(changed)


def test_old_log_probs_equal_training_forward(batch, tiny_model_dir):
    actor = make_actor(tiny_model_dir)
    batch = with_training_keys(actor, batch)
    actor.model.train()
    log_prob, _ = actor._forward({k: batch.batch[k] for k in ("input_ids", "attention_mask", "position_ids", "responses")},
                                 batch.non_tensor_batch["uid"], 1.0, False)
    assert (log_prob.detach() - batch.batch["old_log_probs"]).abs().max() < 1e-5


def _step_gradient(model_dir, batch, monkeypatch, algorithm=None, extra=None, **cfg):
    """The accumulated gradient of one optimizer step, read before clipping (clipping rescales
    to grad_clip and would hide a wrongly scaled gradient), and the rows of each forward."""
    import rlvr.workers.actor as actor_module

    actor = make_actor(model_dir, algorithm, **cfg)
    batch = with_training_keys(actor, batch)
    batch.batch["old_log_probs"] = batch.batch["old_log_probs"] + 0.05  # ratios away from 1
    for key, make in (extra or {}).items():  # keys the trainer adds (rollout correction)
        batch.batch[key] = make(batch)
    actor.config.ppo_mini_batch_size = 2
    seen, forwards = [], []
    forward = actor._forward

    def record_forward(fwd_batch, *args, **kwargs):
        forwards.append(len(fwd_batch["input_ids"]))
        return forward(fwd_batch, *args, **kwargs)

    def record_then_skip(model, optimizer, grad_clip):
        seen.append(torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None]).clone())
        return 1.0, True

    monkeypatch.setattr(actor_module, "clip_and_step", record_then_skip)
    actor._forward = record_forward
    actor.update_policy(batch)
    assert len(seen) == 1
    return seen[0], forwards


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"])
def test_gradient_invariant_to_micro_batching_and_packing(batch, tiny_model_dir, mode, monkeypatch):
    ref, _ = _step_gradient(tiny_model_dir, batch, monkeypatch, ppo_micro_batch_size_per_gpu=6,
                            share_prompt_forward=False, loss_agg_mode=mode)
    assert ref.norm() > 1.0  # large enough that clipping at grad_clip=1 would have rescaled it
    for kwargs in ({"ppo_micro_batch_size_per_gpu": 1, "share_prompt_forward": False},
                   {"ppo_micro_batch_size_per_gpu": 3, "share_prompt_forward": True},
                   # groups of 3 larger than the micro-batch: each group is cut into pieces
                   {"ppo_micro_batch_size_per_gpu": 2, "share_prompt_forward": True},
                   {"ppo_micro_batch_size_per_gpu": 1, "share_prompt_forward": True},
                   {"use_dynamic_bsz": True, "ppo_max_token_len_per_gpu": 40, "share_prompt_forward": True}):
        other, forwards = _step_gradient(tiny_model_dir, batch, monkeypatch, loss_agg_mode=mode, **kwargs)
        assert ((other - ref).norm() / ref.norm()) < 1e-4, kwargs


@pytest.mark.parametrize("micro", [1, 2])
def test_a_group_larger_than_the_micro_batch_is_split(batch, tiny_model_dir, monkeypatch, micro):
    """n = 3 with micro-batches of 1 or 2 rows: no forward holds more rows than configured
    (a packed group of 3 would be 3 rows of activations); every row is still trained once."""
    _, forwards = _step_gradient(tiny_model_dir, batch, monkeypatch, ppo_micro_batch_size_per_gpu=micro,
                                 share_prompt_forward=True)
    assert max(forwards) <= micro and sum(forwards) == 6


def test_a_group_over_the_token_budget_is_split(batch, tiny_model_dir):
    actor = make_actor(tiny_model_dir, use_dynamic_bsz=True, ppo_max_token_len_per_gpu=40)
    mask = batch.batch["attention_mask"]
    R = batch.batch["responses"].shape[1]
    micros, _ = actor._micro_batches(batch, list(range(6)), 6)
    for rows in micros:  # packed: the prompt once plus each response, within the budget
        tokens = int(mask[rows[0], :-R].sum()) + int(mask[rows, -R:].sum())
        assert tokens <= 40 or len(rows) == 1, (rows, tokens)
    assert sorted(r for m in micros for r in m) == list(range(6)) and len(micros) > 2


def test_nonfinite_gradient_skips_the_step(batch, tiny_model_dir):
    actor = make_actor(tiny_model_dir)
    batch = with_training_keys(actor, batch)
    batch.batch["advantages"][0, 0] = float("nan")
    before = [p.detach().clone() for p in actor.model.parameters()]
    metrics = actor.update_policy(batch)
    assert metrics["actor/grad_norm_nonfinite"] == 1.0
    assert all(torch.equal(a, p) for a, p in zip(before, actor.model.parameters()))


def test_the_on_policy_update_writes_pi_old_for_rows_left_out_of_the_loss(batch, tiny_model_dir):
    """The update's own forward gives pi_old (no separate pass); a group left out of the loss (a
    NaN reward: train_mask 0) still gets its log-probs, which the engine-vs-actor metrics compare
    with the rollout's (zeros there read as |log p| of disagreement)."""
    actor = make_actor(tiny_model_dir, ppo_mini_batch_size=2)
    want, _ = actor.compute_log_prob(with_training_keys(actor, batch))
    del batch.batch["old_log_probs"]
    batch.batch["train_mask"] = batch.batch["response_mask"].clone()
    batch.batch["train_mask"][:3] = 0  # the first prompt's group is left out
    actor.update_policy(batch)
    mask = batch.batch["response_mask"].bool()
    assert torch.allclose(batch.batch["old_log_probs"][mask], want[mask], atol=1e-5)
    assert (batch.batch["old_log_probs"][:3][mask[:3]] != 0).all()


def test_skipped_steps_are_counted_not_averaged(batch, tiny_model_dir):
    """Two optimizer steps (mini-batches of one prompt), the first one's gradient NaN: one step
    skipped, reported as 1 (the console's "skipped steps"), not the mean 0.5."""
    actor = make_actor(tiny_model_dir, ppo_mini_batch_size=1)
    batch = with_training_keys(actor, batch)
    batch.batch["advantages"][0, 0] = float("nan")  # row 0: the first prompt's group
    assert actor.update_policy(batch)["actor/grad_norm_nonfinite"] == 1.0


def test_consecutive_nonfinite_steps_stop_the_run(batch, tiny_model_dir):
    from rlvr.workers.actor import NonFiniteLossError

    actor = make_actor(tiny_model_dir, max_consecutive_skipped_steps=2)
    batch = with_training_keys(actor, batch)
    batch.batch["advantages"][0, 0] = float("nan")  # every update of this batch is NaN
    assert actor.update_policy(batch)["actor/grad_norm_nonfinite"] == 1.0  # one skipped step is tolerated
    with pytest.raises(NonFiniteLossError, match="2 optimizer steps in a row were skipped.*max_consecutive_skipped_steps"):
        actor.update_policy(batch)
    clean = with_training_keys(make_actor(tiny_model_dir, max_consecutive_skipped_steps=2), batch)
    clean.batch["advantages"] = torch.nan_to_num(clean.batch["advantages"])
    actor.skipped_in_a_row = 1
    actor.update_policy(clean)  # a finite step resets the count
    assert actor.skipped_in_a_row == 0


def test_mini_batches_hold_whole_groups_and_are_reproducible(batch, tiny_model_dir):
    actor = make_actor(tiny_model_dir)
    actor.config.ppo_mini_batch_size = 1
    minis = actor._mini_batches(batch, epoch=0)
    assert sorted(map(sorted, minis)) == [[0, 1, 2], [3, 4, 5]]
    assert minis == actor._mini_batches(batch, epoch=0)
    assert np.all([len(m) == 3 for m in minis])


def test_critic_reads_its_model_settings(tiny_model_dir):
    from rlvr.config.schema import CriticConfig, ModelConfig
    from rlvr.workers.critic import CriticWorker

    config = CriticConfig(model=ModelConfig(path=str(tiny_model_dir), override_config={"attention_dropout": 0.25},
                                            enable_gradient_checkpointing=True))
    critic = CriticWorker(config, total_training_steps=2, pad_id=0, device="cpu")
    critic.init_model()
    assert critic.model.config.attention_dropout == 0.25
    assert critic.model.is_gradient_checkpointing


def test_the_critic_takes_the_actors_forward_layout(batch, tiny_model_dir, monkeypatch):
    """actor.share_prompt_forward=false reaches the critic (it always packed), with the same values."""
    from rlvr.config.schema import CriticConfig, ModelConfig
    from rlvr.workers import critic as critic_module

    layouts = []
    real = critic_module.response_states
    monkeypatch.setattr(critic_module, "response_states",
                        lambda model, b, uids, share, pad: layouts.append(share) or real(model, b, uids, share, pad))
    values = {}
    for share in (True, False):
        critic = critic_module.CriticWorker(CriticConfig(model=ModelConfig(path=str(tiny_model_dir))), 2, 0,
                                            device="cpu", share_prompt=share)
        torch.manual_seed(0)  # the value head is drawn at init: the same for both
        critic.init_model()
        batch.meta_info["micro_batch_size"] = 6
        values[share] = critic.compute_values(batch).batch["values"]
    assert layouts == [True, False]
    mask = batch.batch["response_mask"].bool()
    assert torch.allclose(values[True][mask], values[False][mask], atol=1e-5)


def test_the_critics_mini_batches_follow_actor_shuffle(batch, tiny_model_dir, monkeypatch):
    """verl's critic.shuffle is the actor's: --config verl (actor.shuffle false) keeps the groups in
    order in the critic's update too (it always shuffled)."""
    from rlvr.config.schema import CriticConfig, ModelConfig
    from rlvr.workers import critic as critic_module

    seeds = []
    real = critic_module.shuffled_mini_batches
    monkeypatch.setattr(critic_module, "shuffled_mini_batches",
                        lambda uids, n, per, seed: seeds.append(seed) or real(uids, n, per, seed))
    for shuffle in (True, False):
        critic = critic_module.CriticWorker(CriticConfig(model=ModelConfig(path=str(tiny_model_dir)),
                                                         ppo_mini_batch_size=1, ppo_epochs=1, ppo_micro_batch_size_per_gpu=6),
                                            2, 0, device="cpu", shuffle=shuffle)
        critic.init_model()
        batch.meta_info["micro_batch_size"] = 6
        batch.batch["values"] = critic.compute_values(batch).batch["values"]
        batch.batch["returns"] = batch.batch["values"] + 0.5
        critic.update_critic(batch)
    assert seeds[0] is not None and seeds[1] is None


def with_tool_tokens(batch):
    """Columns 2-3 of every response long enough become tool output: present (attention 1) but
    not the model's (response_mask 0), as a multi-turn rollout lays them out."""
    mask = batch.batch["response_mask"].clone()
    long_enough = mask.sum(-1) >= 5
    mask[long_enough, 2:4] = 0
    batch.batch["response_mask"] = mask
    return batch


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-sum"])
def test_gradient_invariant_to_micro_batching_with_tool_tokens(batch, tiny_model_dir, mode, monkeypatch):
    batch = with_tool_tokens(batch)
    ref, _ = _step_gradient(tiny_model_dir, batch, monkeypatch, ppo_micro_batch_size_per_gpu=6,
                            share_prompt_forward=False, loss_agg_mode=mode)
    for kwargs in ({"ppo_micro_batch_size_per_gpu": 1, "share_prompt_forward": False},
                   {"ppo_micro_batch_size_per_gpu": 2, "share_prompt_forward": True},
                   {"use_dynamic_bsz": True, "ppo_max_token_len_per_gpu": 40, "share_prompt_forward": True}):
        other, _ = _step_gradient(tiny_model_dir, batch, monkeypatch, loss_agg_mode=mode, **kwargs)
        assert ((other - ref).norm() / ref.norm()) < 1e-4, kwargs


def test_tool_tokens_are_context_not_loss(batch, tiny_model_dir, monkeypatch):
    """Columns masked as tool output leave the loss (the gradient changes when they are masked)
    but stay in the context: replacing their tokens changes the remaining tokens' gradient."""
    import copy

    plain, _ = _step_gradient(tiny_model_dir, copy.deepcopy(batch), monkeypatch)
    tool, _ = _step_gradient(tiny_model_dir, with_tool_tokens(copy.deepcopy(batch)), monkeypatch)
    assert (plain - tool).norm() / plain.norm() > 1e-3
    other = with_tool_tokens(copy.deepcopy(batch))
    R = other.batch["responses"].shape[1]
    present = other.batch["attention_mask"][:, -R:][:, 2:4].bool()
    other.batch["responses"][:, 2:4] = torch.where(present, other.batch["responses"][:, 2:4] + 1,
                                                   other.batch["responses"][:, 2:4])
    other.batch["input_ids"][:, -R:] = other.batch["responses"]
    changed, _ = _step_gradient(tiny_model_dir, other, monkeypatch)
    assert (changed - tool).norm() / tool.norm() > 1e-3


def test_a_train_batch_that_mini_batches_do_not_divide_ends_with_a_smaller_mini_batch(tokenizer, tiny_model_dir,
                                                                                        monkeypatch):
    """verl's scripts set e.g. train_batch_size=1024 with ppo_mini_batch_size=80: 12 mini-batches of 80
    prompts and a last one of 64. Here 5 prompts (n = 2) in mini-batches of 2: optimizer steps over
    2, 2 and 1 whole prompt groups, each loss normalised by its own mini-batch's tokens."""
    from rlvr.config import load_config
    from rlvr.workers import actor as actor_module
    from tests.workers.conftest import make_batch

    cfg = load_config(overrides=["data.train_batch_size=5", "actor_rollout_ref.rollout.n=2",
                                 "actor_rollout_ref.actor.ppo_mini_batch_size=2",
                                 "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
                                 "actor_rollout_ref.actor.shuffle=false", "actor_rollout_ref.actor.use_kl_loss=false",
                                 "actor_rollout_ref.actor.entropy_coeff=0", "trainer.device=cpu"])
    actor_cfg = cfg.actor_rollout_ref.actor
    model = load_model(tiny_model_dir)
    opt, sched = build_optimizer(model, OptimConfig(lr=1e-3), total_steps=10)
    actor = Actor(model, actor_cfg, optimizer=opt, scheduler=sched, pad_id=0, max_response_length=7)
    lengths = (7, 3, 5, 2, 7, 1, 4, 6, 2, 5)
    data = make_batch(tokenizer, response_lengths=lengths, n=len(lengths))  # one prompt text for every row
    data.non_tensor_batch["uid"] = np.array([f"p{i // 2}" for i in range(10)], dtype=object)  # 5 groups of 2
    data.meta_info["micro_batch_size"] = 2
    data.batch["old_log_probs"], _ = actor.compute_log_prob(data)
    data.batch["advantages"] = torch.linspace(-1, 1, 10)[:, None] * data.batch["response_mask"]

    steps, normalisers = [], []
    real_step, real_loss = actor_module.clip_and_step, actor_module.call_policy_loss
    monkeypatch.setattr(actor_module, "clip_and_step", lambda *a: (steps.append(len(normalisers)), real_step(*a))[1])
    monkeypatch.setattr(actor_module, "call_policy_loss",
                        lambda *a, **kw: (normalisers.append(float(kw["num_tokens"])), real_loss(*a, **kw))[1])
    assert actor._mini_batches(data, epoch=0) == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    metrics = actor.update_policy(data)
    # three optimizer steps; micro-batches of one group (2 rows) each: 2, 2 and 1 loss calls per step
    assert steps == [2, 4, 5]
    # token-mean over each mini-batch's own tokens: 7+3+5+2 = 17, 7+1+4+6 = 18, 2+5 = 7 (the last, smaller one)
    assert normalisers == [17, 17, 18, 18, 7]
    assert all(math.isfinite(v) for v in metrics.values())


# ------------------------------------------------------------------ rollout correction in the update
PLAIN = dict(use_kl_loss=False, entropy_coeff=0.0)  # the policy loss alone


def _correction(**keys):
    from rlvr.config.schema import AlgorithmConfig, RolloutCorrectionConfig

    return AlgorithmConfig(rollout_correction=RolloutCorrectionConfig(**keys))


def test_importance_weights_scale_the_policy_gradient(batch, tiny_model_dir, monkeypatch):
    plain, _ = _step_gradient(tiny_model_dir, batch.select_idxs(list(range(6))), monkeypatch, **PLAIN)
    doubled, _ = _step_gradient(tiny_model_dir, batch, monkeypatch, _correction(rollout_is="token"),
                                {"rollout_is_weights": lambda b: 2.0 * b.batch["response_mask"].float()}, **PLAIN)
    assert torch.allclose(doubled, 2 * plain, rtol=1e-5, atol=1e-9)  # the loss is linear in the weights


def test_rejected_tokens_leave_the_loss_as_if_masked(batch, tiny_model_dir, monkeypatch):
    reject = torch.ones(6, 7)
    reject[3:] = 0  # the second group rejected
    rejected, _ = _step_gradient(tiny_model_dir, batch.select_idxs(list(range(6))), monkeypatch,
                                 _correction(rollout_rs="token_k3", rollout_rs_threshold=0.1),
                                 {"train_mask": lambda b: b.batch["response_mask"] * reject.long()}, **PLAIN)
    masked = batch.select_idxs(list(range(6)))
    masked.batch["response_mask"] = masked.batch["response_mask"] * reject.long()  # verl's spelling of it
    expected, _ = _step_gradient(tiny_model_dir, masked, monkeypatch, **PLAIN)
    assert rejected.abs().max() > 0 and torch.allclose(rejected, expected, rtol=1e-5, atol=1e-9)


def test_bypass_reinforce_with_token_weights_is_the_ppo_gradient(batch, tiny_model_dir, monkeypatch):
    """pi_old = pi_rollout = pi * e^0.05 (the update's forward): PPO's gradient is -A r grad log pi with
    r = e^-0.05 (inside the clip range), REINFORCE's -A w grad log pi with w = r (token IS, under the
    cap): equal; without weights REINFORCE's is e^0.05 times PPO's."""
    ppo, _ = _step_gradient(tiny_model_dir, batch.select_idxs(list(range(6))), monkeypatch, **PLAIN)
    weighted, _ = _step_gradient(tiny_model_dir, batch.select_idxs(list(range(6))), monkeypatch,
                                 _correction(bypass_mode=True, loss_type="reinforce", rollout_is="token"), **PLAIN)
    plain, _ = _step_gradient(tiny_model_dir, batch.select_idxs(list(range(6))), monkeypatch,
                              _correction(bypass_mode=True, loss_type="reinforce"), **PLAIN)
    atol = 1e-4 * ppo.abs().max()  # the update's forward equals the log-prob pass within 1e-5, not exactly
    assert torch.allclose(weighted, ppo, rtol=1e-4, atol=atol)
    assert torch.allclose(plain, ppo * math.exp(0.05), rtol=1e-4, atol=atol)
    assert not torch.allclose(plain, ppo, rtol=1e-3, atol=atol)


def test_bypass_rejection_compares_the_policy_being_trained(batch, tiny_model_dir, monkeypatch):
    # k1 = log(pi_rollout / pi) = 0.05 on every token: inside [log 0.5, log 2], outside [log 1.2, log 2]
    kept, _ = _step_gradient(tiny_model_dir, batch.select_idxs(list(range(6))), monkeypatch,
                             _correction(bypass_mode=True, rollout_rs="token_k1", rollout_rs_threshold=2.0), **PLAIN)
    refused, _ = _step_gradient(tiny_model_dir, batch.select_idxs(list(range(6))), monkeypatch,
                                _correction(bypass_mode=True, rollout_rs="token_k1", rollout_rs_threshold="1.2_2.0"),
                                **PLAIN)
    assert kept.abs().max() > 0 and refused.abs().max() == 0
