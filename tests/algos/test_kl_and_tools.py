"""KL estimators, controllers, KL-in-reward, DAPO tools and masked statistics."""

import math

import numpy as np
import pytest
import torch

from rlvr.algos import (
    AdaptiveKLController,
    FixedKLController,
    apply_kl_penalty,
    compute_response_mask,
    filter_groups,
    get_kl_controller,
    kl_penalty,
    masked_mean,
    masked_sum,
    masked_var,
    masked_whiten,
    overlong_penalty,
)
from rlvr.algos.kl import KL_TYPES
from rlvr.algos.utils import group_ids, in_groups
from rlvr.config.schema import KLControlConfig

LOGP, REF = torch.tensor([-1.0]), torch.tensor([-2.0])  # x = logp - ref = 1


@pytest.mark.parametrize(
    "kind, expected",
    [
        ("kl", 1.0), ("k1", 1.0),  # x
        ("abs", 1.0),  # |x|
        ("mse", 0.5), ("k2", 0.5),  # x^2 / 2
        ("low_var_kl", math.exp(-1) + 1 - 1), ("k3", math.exp(-1)),  # e^(ref-logp) - (ref-logp) - 1 = e^-1 + 1 - 1
        ("k1+", 1.0), ("k3+", math.exp(-1)),  # straight-through: the value of the named estimator
    ],
)
def test_kl_values(kind, expected):
    assert kl_penalty(LOGP, REF, kind).item() == pytest.approx(expected, rel=1e-6)


def test_k1_is_negative_when_policy_below_reference():
    assert kl_penalty(torch.tensor([-2.0]), torch.tensor([-1.0]), "kl").item() == pytest.approx(-1.0)


def test_k3_is_clamped():
    # logp 0, ref -30: log ratio clamped to -20 -> e^-20 + 20 - 1 = 19 -> clamped to 10
    assert kl_penalty(torch.tensor([0.0]), torch.tensor([-30.0]), "k3").item() == 10.0


def test_full_kl_from_distributions():
    p, q = torch.tensor([[0.5, 0.5]]).log(), torch.tensor([[0.25, 0.75]]).log()
    # 0.5 ln(0.5/0.25) + 0.5 ln(0.5/0.75) = 0.5 * 0.693147 - 0.5 * 0.405465 = 0.143841
    assert kl_penalty(p, q, "full").item() == pytest.approx(0.143841, abs=1e-6)


def test_unknown_kl_type():
    with pytest.raises(ValueError, match="unknown KL estimator 'k4'"):
        kl_penalty(LOGP, REF, "k4")


@pytest.mark.parametrize("kind", ["kl", "abs", "mse", "low_var_kl"])
def test_kl_gradcheck(kind):
    g = torch.Generator().manual_seed(0)
    logp = (-torch.rand(5, generator=g, dtype=torch.float64) - 0.5).requires_grad_(True)
    ref = -torch.rand(5, generator=g, dtype=torch.float64) - 0.1
    assert torch.autograd.gradcheck(lambda lp: kl_penalty(lp, ref, kind), (logp,))


def test_full_kl_gradcheck():
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(2, 4, generator=g, dtype=torch.float64, requires_grad=True)
    ref = torch.log_softmax(torch.randn(2, 4, generator=g, dtype=torch.float64), -1)
    assert torch.autograd.gradcheck(lambda z: kl_penalty(torch.log_softmax(z, -1), ref, "full"), (logits,))


@pytest.mark.parametrize("kind", ["k1+", "k3+"])
def test_straight_through_has_k2_gradient(kind):
    g = torch.Generator().manual_seed(2)
    logp = (-torch.rand(5, generator=g, dtype=torch.float64) - 0.5).requires_grad_(True)
    ref = -torch.rand(5, generator=g, dtype=torch.float64) - 0.1
    (grad_plus,) = torch.autograd.grad(kl_penalty(logp, ref, kind).sum(), logp)
    (grad_k2,) = torch.autograd.grad(kl_penalty(logp, ref, "k2").sum(), logp)
    assert torch.allclose(grad_plus, grad_k2)  # k2's gradient: logp - ref
    assert torch.allclose(grad_plus, (logp - ref).detach())
    assert torch.autograd.gradcheck(lambda lp: kl_penalty(lp, ref, "k2"), (logp,))
    assert torch.allclose(kl_penalty(logp, ref, kind), kl_penalty(logp, ref, kind[:-1]))


def test_kl_types_listed():
    assert {"kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3", "full", "k1+", "k3+"} <= set(KL_TYPES)


def test_kl_controllers():
    fixed = get_kl_controller(KLControlConfig(type="fixed", kl_coef=0.05))
    fixed.update(10.0, 8)
    assert isinstance(fixed, FixedKLController) and fixed.value == 0.05
    adaptive = get_kl_controller(KLControlConfig(type="adaptive", kl_coef=0.1, target_kl=0.1, horizon=100))
    assert isinstance(adaptive, AdaptiveKLController)
    adaptive.update(current_kl=0.2, n_steps=10)
    # error = clip(0.2 / 0.1 - 1, -0.2, 0.2) = 0.2; multiplier 1 + 0.2 * 10 / 100 = 1.02
    assert adaptive.value == pytest.approx(0.102)
    adaptive.update(current_kl=0.05, n_steps=10)
    # error = 0.05/0.1 - 1 = -0.5 -> -0.2; multiplier 0.98
    assert adaptive.value == pytest.approx(0.102 * 0.98)


def test_apply_kl_penalty():
    scores = torch.tensor([[0.0, 1.0]])
    old, ref, mask = torch.tensor([[-1.0, -1.0]]), torch.tensor([[-2.0, -1.0]]), torch.ones(1, 2)
    rewards, metrics = apply_kl_penalty(scores, old, ref, mask, FixedKLController(0.1), "kl")
    # per-token KL (1, 0); rewards = scores - 0.1 * KL = (-0.1, 1); mean KL per sample 0.5
    assert torch.allclose(rewards, torch.tensor([[-0.1, 1.0]]))
    assert metrics == {"actor/reward_kl_penalty": pytest.approx(0.5), "actor/reward_kl_penalty_coeff": 0.1}
    # a NaN log-prob at a masked position (padding, tool output) stays out of the rewards: NaN x 0 is NaN,
    # and an estimator that sums the row's rewards unmasked read the whole row's score as NaN
    old_nan = torch.tensor([[-1.0, float("nan")]])
    rewards, metrics = apply_kl_penalty(scores, old_nan, ref, torch.tensor([[1.0, 0.0]]), FixedKLController(0.1), "kl")
    assert torch.allclose(rewards, torch.tensor([[-0.1, 1.0]])) and metrics["actor/reward_kl_penalty"] == 1.0


def test_filter_groups_keeps_groups_with_signal():
    index = np.array(["a", "a", "b", "b", "c"], dtype=object)
    acc = torch.tensor([1.0, 0.0, 1.0, 1.0, 0.0])
    # a has spread -> keep; b is all correct -> drop; c is a group of one -> keep (as verl)
    assert filter_groups(index, acc).tolist() == [True, True, False, False, True]


def test_filter_groups_keeps_an_int_uid_and_its_str_apart():
    # uid 1 scores (1, 1), uid "1" (0, 0): each group is all right or all wrong -> both dropped. As one
    # group (the uids cast to str) the scores (1, 1, 0, 0) varied and all four rows were kept.
    index = np.array([1, 1, "1", "1"], dtype=object)
    assert filter_groups(index, torch.tensor([1.0, 1.0, 0.0, 0.0])).tolist() == [False, False, False, False]


def test_group_ids_group_uids_by_value_in_order_of_first_appearance():
    # as verl's dict of uids: 1 and "1" are two groups, 1 and 1.0 (equal, same hash) one
    ids, num_groups = group_ids(np.array(["b", 1, "1", 1.0, "b"], dtype=object))
    assert ids.tolist() == [0, 1, 2, 1, 0] and num_groups == 3
    assert in_groups(np.array(["b", 1, "1", 1.0], dtype=object), [1]).tolist() == [False, True, False, True]
    with pytest.raises(TypeError, match="a uid must be hashable"):
        group_ids([[1], [1]])


def test_overlong_penalty():
    # max 10, buffer 4 -> penalty starts after 6 tokens: 8 -> -(2/4) = -0.5; 10 -> -1
    got = overlong_penalty(torch.tensor([5, 6, 8, 10]), max_response_length=10, overlong_buffer_len=4)
    assert got.tolist() == [0.0, 0.0, -0.5, -1.0]
    with pytest.raises(ValueError, match="overlong_buffer_len"):
        overlong_penalty(torch.tensor([1]), 10, 0)


def test_masked_statistics():
    values = torch.tensor([[1.0, 2.0, 100.0], [3.0, 100.0, 100.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    assert masked_mean(values, mask).item() == pytest.approx(2.0)  # (1 + 2 + 3) / 3
    assert masked_mean(values, mask, dim=-1).tolist() == [1.5, 3.0]
    assert masked_var(values, mask).item() == pytest.approx(1.0)  # deviations -1, 0, 1 -> 2 / (3 - 1)
    assert masked_var(values, mask, unbiased=False).item() == pytest.approx(2 / 3)
    w = masked_whiten(values, mask)
    assert torch.allclose(w[mask.bool()], torch.tensor([-1.0, 0.0, 1.0]), atol=1e-6)


def test_masked_statistics_ignore_nan_and_inf_at_masked_positions():
    values = torch.tensor([[1.0, 2.0, float("nan")], [3.0, float("inf"), float("-inf")]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    assert masked_sum(values, mask).item() == 6.0  # 1 + 2 + 3; NaN * 0 would be NaN
    assert masked_sum(values, mask, dim=-1).tolist() == [3.0, 3.0]
    assert masked_mean(values, mask).item() == pytest.approx(2.0)
    assert masked_mean(values, mask, dim=-1).tolist() == [1.5, 3.0]
    assert masked_var(values, mask).item() == pytest.approx(1.0)
    assert torch.allclose(masked_whiten(values, mask, shift_mean=False)[mask.bool()], torch.tensor([1.0, 2.0, 3.0]),
                          atol=1e-6)
    with pytest.raises(ValueError, match="at least 2"):
        masked_var(values, torch.tensor([[1.0, 0, 0], [0, 0, 0]]))
    # scores near the reward bound: squares past float32's range; whitened in float64 (the variance was inf
    # and every value 0): mean 0, var 2 x 2.25e38 / (2 - 1) = 4.5e38, +-1.5e19 / 2.1213e19 = +-0.70711
    big = torch.tensor([[1.5e19, -1.5e19]])
    assert masked_var(big.double(), torch.ones(1, 2)).item() == pytest.approx(4.5e38, rel=1e-6)
    assert torch.allclose(masked_whiten(big, torch.ones(1, 2)), torch.tensor([[0.70711, -0.70711]]), atol=1e-5)


def test_compute_response_mask():
    attention = torch.tensor([[0, 1, 1, 1, 0], [1, 1, 1, 0, 0]])
    assert compute_response_mask(torch.zeros(2, 2), attention).tolist() == [[1, 0], [0, 0]]
