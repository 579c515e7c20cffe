"""On-policy distillation losses against hand-computed values (arithmetic in the comments)."""

import math
from types import SimpleNamespace

import pytest
import torch

from rlvr.algos.distillation import DISTILLATION_LOSSES, distillation_loss, get_distillation_loss
from rlvr.config.schema import ActorConfig, DistillationLossConfig

S = torch.tensor([[-1.0, -2.0]])  # the student's log-probs of two sampled tokens
T = torch.tensor([[-1.5, -1.0]])  # the teacher's


@pytest.mark.parametrize("mode, expected", [
    ("k1", [0.5, -1.0]),  # s - t: -1 + 1.5 = 0.5; -2 + 1 = -1
    ("kl", [0.5, -1.0]),
    ("abs", [0.5, 1.0]),
    ("k2", [0.125, 0.5]),  # (s - t)^2 / 2: 0.25 / 2; 1 / 2
    ("mse", [0.125, 0.5]),
    # d = t - s = -0.5, 1.0: e^d - d - 1 = 0.60653 + 0.5 - 1 = 0.10653; 2.71828 - 1 - 1 = 0.71828
    ("k3", [math.exp(-0.5) - 0.5, math.e - 2.0]),
    ("low_var_kl", [math.exp(-0.5) - 0.5, math.e - 2.0]),
])
def test_estimator_modes(mode, expected):
    fn = get_distillation_loss(mode)
    assert not fn.use_topk
    assert torch.allclose(fn(S, T, DistillationLossConfig()), torch.tensor([expected]), atol=1e-6)


def test_forward_kl_topk_sums_over_the_teachers_tokens():
    fn = get_distillation_loss("forward_kl_topk")
    assert fn.use_topk
    # the teacher's top-2 probabilities 0.6, 0.3, the student's 0.5, 0.25 at the same tokens:
    # 0.6 ln(0.6/0.5) + 0.3 ln(0.3/0.25) = 0.9 ln 1.2 = 0.164089
    t = torch.log(torch.tensor([[[0.6, 0.3]]]))
    s = torch.log(torch.tensor([[[0.5, 0.25]]]))
    assert torch.allclose(fn(s, t, DistillationLossConfig()), torch.tensor([[0.9 * math.log(1.2)]]), atol=1e-6)
    # truncated to k = 1 the sum can be negative (0.5 ln(0.5/0.8) = -0.235): floored at 0, as verl does
    low = fn(torch.log(torch.tensor([[[0.8]]])), torch.log(torch.tensor([[[0.5]]])), DistillationLossConfig())
    assert low.item() == 0.0


def test_forward_kl_topk_log_prob_floor():
    fn = get_distillation_loss("forward_kl_topk")
    t = torch.tensor([[[math.log(0.6), -3.0]]])
    s = torch.tensor([[[math.log(0.3), -5.0]]])
    # no floor: 0.6 ln 2 + e^-3 (-3 + 5) = 0.415888 + 0.099574 = 0.515462
    assert fn(s, t, DistillationLossConfig()).item() == pytest.approx(0.6 * math.log(2) + 2 * math.exp(-3), abs=1e-6)
    # floor -4: the student's -5 becomes -4: 0.415888 + e^-3 (-3 + 4) = 0.465675
    floored = fn(s, t, DistillationLossConfig(log_prob_min_clamp=-4.0)).item()
    assert floored == pytest.approx(0.6 * math.log(2) + math.exp(-3), abs=1e-6)


def test_registry_names_verls_modes_and_refuses_unknown_ones():
    assert DISTILLATION_LOSSES.names() == ["abs", "forward_kl_topk", "k1", "k2", "k3", "kl", "low_var_kl", "mse"]
    with pytest.raises(ValueError, match="registered:.*forward_kl_topk"):
        get_distillation_loss("jsd_topk")


def _actor(**kw):
    return ActorConfig(loss_agg_mode="token-mean", **kw)


def test_direct_loss_is_aggregated_like_any_term_and_clamped():
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    s = torch.tensor([[-1.0, -2.0, -7.0]], requires_grad=True)
    t = torch.tensor([[-4.0, -1.0, 0.0]])
    cfg = DistillationLossConfig(loss_mode="abs", loss_max_clamp=2.0)
    # |s - t| = 3, 1 (the masked 7 never counts); clamped to 2: 2, 1; token-mean over 2 tokens = 1.5
    loss, metrics = distillation_loss(s, t, s, s.detach(), mask, cfg, _actor())
    assert loss.item() == pytest.approx(1.5)
    assert metrics["actor/distillation/loss"] == pytest.approx(1.5)
    assert metrics["actor/distillation/abs_loss"] == pytest.approx(1.5)
    loss.backward()
    # the clamped token has no gradient; the other: d|s - t|/ds / 2 = -1 / 2 (s < t)
    assert torch.allclose(s.grad, torch.tensor([[0.0, -0.5, 0.0]]))
    # the mini-batch's totals: the same micro-batch as a third of 6 tokens weighs 2/6 of its sum
    share, _ = distillation_loss(s.detach(), t, s.detach(), s.detach(), mask, cfg, _actor(), num_tokens=6.0)
    assert share.item() == pytest.approx(3.0 / 6.0)


def test_policy_gradient_mode_makes_the_teacher_gap_an_advantage_with_its_own_clip():
    mask = torch.ones(1, 2)
    cfg = DistillationLossConfig(loss_mode="k1", use_policy_gradient=True)
    log_prob = S.clone().requires_grad_(True)
    # k1 = s - t = 0.5, -1.0, so the advantages are t - s = -0.5, 1.0. At ratio 1 the vanilla loss
    # is -mean(A) = -(-0.5 + 1.0) / 2 = -0.25 and its gradient -A / 2 = 0.25, -0.5
    loss, _ = distillation_loss(S, T, log_prob, S, mask, cfg, _actor())
    assert loss.item() == pytest.approx(-0.25)
    loss.backward()
    assert torch.allclose(log_prob.grad, torch.tensor([[0.25, -0.5]]))
    # ratio e^0.15 = 1.162 on the positive-advantage token: inside the actor's clip 0.2, outside the
    # distillation's 0.1, which is the one that applies: that token is clipped (1 of 2 tokens)
    moved = S + torch.tensor([[0.0, 0.15]])
    narrow = DistillationLossConfig(loss_mode="k1", use_policy_gradient=True, clip_ratio=0.1, clip_ratio_low=0.1,
                                    clip_ratio_high=0.1)
    _, metrics = distillation_loss(moved, T, moved, S, mask, narrow, _actor(clip_ratio=0.2))
    assert metrics["actor/distillation/pg_clipfrac"] == pytest.approx(0.5)
    _, wide = distillation_loss(moved, T, moved, S, mask, cfg, _actor(clip_ratio=0.2))
    assert wide["actor/distillation/pg_clipfrac"] == 0.0
    # clip_ratio alone sets both sides (low and high default to it; in verl's YAML they are 0.2 each,
    # so its clip_ratio alone changes nothing)
    alone = DistillationLossConfig(loss_mode="k1", use_policy_gradient=True, clip_ratio=0.1)
    _, metrics = distillation_loss(moved, T, moved, S, mask, alone, _actor(clip_ratio=0.2))
    assert metrics["actor/distillation/pg_clipfrac"] == pytest.approx(0.5)
