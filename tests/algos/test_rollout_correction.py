"""algorithm.rollout_correction: importance weights, rejection, bypass mode's REINFORCE loss,
the gap metrics; values computed by hand (arithmetic in the comments)."""

import math

import pytest
import torch

from rlvr.algos.rollout_correction import (batch_norm_sums, gap_metrics, is_weights, parse_is_threshold, parse_rs,
                                           reinforce_loss, rejection_mask, rollout_correction)
from rlvr.config.schema import RolloutCorrectionConfig

LN = math.log
# row A: pi_old / pi_rollout = 3, 0.8, 1.5; row B: 1.1, 0.9 and a padded token
LOG_RATIO = torch.tensor([[LN(3), LN(0.8), LN(1.5)], [LN(1.1), LN(0.9), 0.0]], dtype=torch.float64)
def close(tensor, expected) -> bool:
    return torch.allclose(tensor, torch.tensor(expected, dtype=tensor.dtype))


MASK = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]], dtype=torch.float64)


def test_thresholds_parse_as_verl_spells_them():
    assert parse_is_threshold(2.0) == (2.0, None) and parse_is_threshold("2") == (2.0, None)
    assert parse_is_threshold("0.5_2.0") == (2.0, 0.5)  # IcePop: lower_upper
    for bad in ("2.0_0.5", "-1", "x", True, None):
        with pytest.raises(ValueError):
            parse_is_threshold(bad)
    # k1 takes ratio bounds (an upper alone: lower = 1 / upper); k2, k3 one upper bound; one shared or one each
    assert parse_rs("token_k1", 2.0) == {"token_k1": (0.5, 2.0)}
    assert parse_rs("token_k1, seq_sum_k3", "0.6_2.0,0.5") == {"token_k1": (0.6, 2.0), "seq_sum_k3": (None, 0.5)}
    assert parse_rs("token_k2,seq_max_k3", 0.1) == {"token_k2": (None, 0.1), "seq_max_k3": (None, 0.1)}
    for options, spec in (("token_k4", 1.0), ("token_k2", None), ("token_k2", "0.1_0.2"), ("seq_max_k1", 1.0),
                          ("token_k2,token_k3", "0.1,0.2,0.3"), ("", 1.0)):
        with pytest.raises(ValueError):
            parse_rs(options, spec)


def test_token_weights_truncate_or_zero_outside_the_band():
    w, m = is_weights(LOG_RATIO[:1], MASK[:1], "token", 2.0)
    assert close(w, [[2.0, 0.8, 1.5]])  # 3 truncated at 2
    # the metrics are of the weights before truncation (verl's): mean (3 + 0.8 + 1.5) / 3 = 5.3/3, max 3;
    # raw > 2: 1 of 3; raw < 1/2: none
    assert m["rollout_is_mean"] == pytest.approx(5.3 / 3) and m["rollout_is_max"] == pytest.approx(3.0)
    assert m["rollout_is_min"] == pytest.approx(0.8)
    assert m["rollout_is_ratio_fraction_high"] == pytest.approx(1 / 3) and m["rollout_is_ratio_fraction_low"] == 0
    # ESS of the weights held in [1/2, 2] (2, 0.8, 1.5): 1 / mean((w / mean w)^2)
    #   = 1 / ((4 + 0.64 + 2.25) / 3 / (4.3/3)^2) = 3 * 4.3^2 / (9 * 6.89)
    assert m["rollout_is_eff_sample_size"] == pytest.approx(4.3 ** 2 / (3 * 6.89))
    w, _ = is_weights(LOG_RATIO[:1], MASK[:1], "token", "0.9_2.0")  # IcePop: 3 and 0.8 fall outside [0.9, 2]
    assert close(w, [[0.0, 0.0, 1.5]])


def test_weight_metrics_are_of_the_weights_before_truncation_as_verl():
    """verl's compute_is_metrics: mean, max and min of the weights before truncation; std and effective
    sample size of the weights held in [1/threshold, threshold]; at sequence level the shares above and
    below are of sequences, not tokens; and per-sequence statistics (rollout_is_seq_*)."""
    # token level: log-ratios ln 3 and 0 at threshold 2 -> raw weights 3 and 1 (truncated: 2 and 1)
    lr, mask = torch.tensor([[LN(3), 0.0]], dtype=torch.float64), torch.ones(1, 2, dtype=torch.float64)
    w, m = is_weights(lr, mask, "token", 2.0)
    assert close(w, [[2.0, 1.0]])
    assert m["rollout_is_mean"] == pytest.approx(2.0) and m["rollout_is_max"] == pytest.approx(3.0)  # (3 + 1) / 2
    assert m["rollout_is_min"] == pytest.approx(1.0) and m["rollout_is_ratio_fraction_high"] == pytest.approx(0.5)
    # held in [0.5, 2]: 2 and 1, mean 1.5, E[w^2] = 2.5 -> std sqrt(2.5 - 2.25) = 0.5;
    # ESS = 1 / mean((w / 1.5)^2) = 1 / ((4 + 1) / 2.25 / 2) = 0.9
    assert m["rollout_is_std"] == pytest.approx(0.5) and m["rollout_is_eff_sample_size"] == pytest.approx(0.9)
    # sequence level: row A's three tokens ln 3, 0, 0 -> 3 on each; row B one token, 1; row C fully masked (left out)
    lr = torch.tensor([[LN(3), 0.0, 0.0], [0.0, 0.0, 0.0], [0.0, 0.0, 0.0]], dtype=torch.float64)
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0], [0.0, 0.0, 0.0]], dtype=torch.float64)
    _, m = is_weights(lr, mask, "sequence", 2.0)
    assert m["rollout_is_mean"] == pytest.approx(2.5)  # over the 4 tokens: (3 + 3 + 3 + 1) / 4
    assert m["rollout_is_max"] == pytest.approx(3.0) and m["rollout_is_min"] == pytest.approx(1.0)
    # above 2: sequence A, 1 of 2 sequences (per token it would be 3 of 4)
    assert m["rollout_is_ratio_fraction_high"] == pytest.approx(0.5) and m["rollout_is_ratio_fraction_low"] == 0.0
    # per sequence: 3 and 1 -> mean 2, unbiased std sqrt(((3-2)^2 + (1-2)^2) / 1) = sqrt 2, farthest from 1: 2
    assert m["rollout_is_seq_mean"] == pytest.approx(2.0) and m["rollout_is_seq_std"] == pytest.approx(math.sqrt(2))
    assert m["rollout_is_seq_max"] == pytest.approx(3.0) and m["rollout_is_seq_min"] == pytest.approx(1.0)
    assert m["rollout_is_seq_max_deviation"] == pytest.approx(2.0)
    assert m["rollout_is_seq_fraction_high"] == pytest.approx(0.5) and m["rollout_is_seq_fraction_low"] == 0.0


def test_sequence_and_geometric_weights_and_batch_normalisation():
    w, _ = is_weights(LOG_RATIO, MASK, "sequence", 2.0)
    # A: 3 * 0.8 * 1.5 = 3.6 -> 2; B: 1.1 * 0.9 = 0.99; the padded token 0
    assert close(w, [[2.0, 2.0, 2.0], [0.99, 0.99, 0.0]])
    w, _ = is_weights(LOG_RATIO, MASK, "geometric", 2.0)
    assert close(w, [[3.6 ** (1 / 3)] * 3, [0.99 ** 0.5] * 2 + [0.0]])
    w, m = is_weights(LOG_RATIO[:1], MASK[:1], "token", 2.0, batch_normalize=True)
    assert close(w, [[2.0 / (4.3 / 3), 0.8 / (4.3 / 3), 1.5 / (4.3 / 3)]])  # mean 1
    assert m["rollout_is_batch_norm_factor"] == pytest.approx(4.3 / 3)
    w, _ = is_weights(LOG_RATIO, MASK, "sequence", 2.0, batch_normalize=True)  # per sequence: (2 + 0.99) / 2
    assert w[1, 0].item() == pytest.approx(0.99 / 1.495)
    assert not is_weights(LOG_RATIO.clone().requires_grad_(), MASK, "token", 2.0)[0].requires_grad


def test_rejection_options():
    # k1 = -log ratio: A = -1.0986, 0.2231, -0.4055; within [log 0.6, log 2] = [-0.511, 0.693]: F T T
    mask, m = rejection_mask(LOG_RATIO, MASK, "token_k1", "0.6_2.0")
    assert mask.tolist() == [[0, 1, 1], [1, 1, 0]]
    assert m["rollout_rs_masked_fraction"] == pytest.approx(1 / 5) and m["rollout_rs_seq_masked_fraction"] == 0.5
    # k3 = r - 1 - log r: A 0.9014 + 0.0231 + 0.0945 = 1.019 > 0.5 (rejected whole); B 0.0047 + 0.0054 kept
    assert rejection_mask(LOG_RATIO, MASK, "seq_sum_k3", 0.5)[0].tolist() == [[0, 0, 0], [1, 1, 0]]
    # mean k1: A (-1.0986 + 0.2231 - 0.4055) / 3 = -0.427 < log 0.9; B (-0.0953 + 0.1054) / 2 = 0.005 inside
    assert rejection_mask(LOG_RATIO, MASK, "seq_mean_k1", "0.9_1.1")[0].tolist() == [[0, 0, 0], [1, 1, 0]]
    # max k2 = (log r)^2 / 2: A 0.6035 > 0.1; B 0.0056
    assert rejection_mask(LOG_RATIO, MASK, "seq_max_k2", 0.1)[0].tolist() == [[0, 0, 0], [1, 1, 0]]
    # both must pass: token k2 <= 0.05 keeps A's 0.8 (0.0249) only, then A fails seq_sum_k3; 3 of 5 tokens out
    mask, m = rejection_mask(LOG_RATIO, MASK, "token_k2,seq_sum_k3", "0.05,0.5")
    assert mask.tolist() == [[0, 0, 0], [1, 1, 0]]
    assert m["rollout_rs_token_k2_masked_fraction"] == pytest.approx(2 / 5)
    assert m["rollout_rs_masked_fraction"] == pytest.approx(3 / 5)


def test_gap_metrics_on_a_known_pair():
    old = torch.tensor([[LN(0.55), LN(0.45)]], dtype=torch.float64)
    rollout = torch.tensor([[LN(0.5), LN(0.5)]], dtype=torch.float64)
    m = gap_metrics(old, rollout, torch.ones(1, 2, dtype=torch.float64))
    r = [1.1, 0.9]  # pi_old / pi_rollout
    assert m["kl"] == pytest.approx(-(LN(1.1) + LN(0.9)) / 2)  # E[log pi_rollout - log pi_old] = 0.005025
    assert m["k3_kl"] == pytest.approx(sum(x - 1 - LN(x) for x in r) / 2)
    assert m["chi2_token"] == pytest.approx((1.21 + 0.81) / 2 - 1)  # 0.01
    assert m["chi2_seq"] == pytest.approx(0.99 ** 2 - 1)
    assert m["training_ppl"] == pytest.approx(math.exp(-(LN(0.55) + LN(0.45)) / 2))
    assert m["rollout_ppl"] == pytest.approx(2.0)


def test_reinforce_loss_and_its_gradient():
    log_prob = torch.tensor([[-1.0, -2.0]], dtype=torch.float64, requires_grad=True)
    rollout = torch.tensor([[-1.5, -2.0]], dtype=torch.float64)
    adv, mask = torch.ones(1, 2, dtype=torch.float64), torch.ones(1, 2, dtype=torch.float64)
    weights = torch.tensor([[2.0, 1.0]], dtype=torch.float64)
    loss, clipfrac, ppo_kl, _ = reinforce_loss(rollout, log_prob, adv, mask, "token-mean", None, weights)
    assert loss.item() == pytest.approx((2 * 1 + 1 * 2) / 2)  # -(2 * -1 + 1 * -2) / 2
    assert ppo_kl.item() == pytest.approx(-0.25)  # mean(rollout - log_prob) = (-0.5 + 0) / 2
    loss.backward()
    assert log_prob.grad.tolist() == [[-1.0, -0.5]]  # -A * w / 2
    assert clipfrac.item() == 0.0


def test_rollout_correction_combines_and_prefixes():
    cfg = RolloutCorrectionConfig(rollout_is="token", rollout_rs="seq_max_k2", rollout_rs_threshold=0.1)
    rollout = torch.zeros_like(LOG_RATIO)
    weights, mask, metrics = rollout_correction(LOG_RATIO, rollout, MASK, cfg)
    assert close(weights, [[2.0, 0.8, 1.5], [1.1, 0.9, 0.0]])
    assert mask.tolist() == [[0, 0, 0], [1, 1, 0]]
    assert {"rollout_corr/rollout_is_mean", "rollout_corr/rollout_rs_masked_fraction", "rollout_corr/kl"} <= set(metrics)
    assert all(k.startswith("rollout_corr/") for k in metrics)
    none = rollout_correction(LOG_RATIO, rollout, MASK, RolloutCorrectionConfig())
    assert none[0] is None and torch.equal(none[1], MASK)


def test_batch_normalisation_over_a_batch_split_in_parts():
    """The sums of ``batch_norm_sums`` add up over the parts of a batch, and ``is_weights`` divides by
    the mean they give (``norm``) instead of its own rows' mean: each part then gets the weights the
    whole batch gets (bypass mode's micro-batches and ranks)."""
    # token weights (threshold 2): A 2, 0.8, 1.5 (sum 4.3 over 3 tokens); B 1.1, 0.9 (sum 2.0 over 2)
    assert batch_norm_sums(LOG_RATIO[:1], MASK[:1], "token", 2.0) == pytest.approx((4.3, 3.0))
    assert batch_norm_sums(LOG_RATIO[1:], MASK[1:], "token", 2.0) == pytest.approx((2.0, 2.0))
    # sequence weights: A 3.6 truncated to 2; B 0.99; one per sequence
    assert batch_norm_sums(LOG_RATIO[:1], MASK[:1], "sequence", 2.0) == pytest.approx((2.0, 1.0))
    assert batch_norm_sums(LOG_RATIO[1:], MASK[1:], "sequence", 2.0) == pytest.approx((0.99, 1.0))
    whole, _ = is_weights(LOG_RATIO, MASK, "token", 2.0, batch_normalize=True)  # mean (4.3 + 2.0) / 5 = 1.26
    assert close(whole, [[2.0 / 1.26, 0.8 / 1.26, 1.5 / 1.26], [1.1 / 1.26, 0.9 / 1.26, 0.0]])
    part, m = is_weights(LOG_RATIO[1:], MASK[1:], "token", 2.0, batch_normalize=True, norm=1.26)
    assert torch.allclose(part, whole[1:]) and m["rollout_is_batch_norm_factor"] == 1.26
    alone, _ = is_weights(LOG_RATIO[1:], MASK[1:], "token", 2.0, batch_normalize=True)  # its own mean, 1.0
    assert close(alone, [[1.1, 0.9, 0.0]])
    weights, _, _ = rollout_correction(LOG_RATIO[1:], torch.zeros(1, 3, dtype=torch.float64), MASK[1:],
                                       RolloutCorrectionConfig(rollout_is="token", rollout_is_batch_normalize=True),
                                       is_norm=1.26)
    assert torch.allclose(weights, whole[1:])
