"""Policy losses, loss aggregation and TIS weights against hand-computed values."""

import math

import pytest
import torch

from rlvr.algos import POLICY_LOSSES, agg_loss, get_policy_loss_fn, register_policy_loss
from rlvr.config.schema import ActorConfig

CFG = ActorConfig(clip_ratio=0.2, clip_ratio_c=3.0)


def loss(name, log_ratio, advantages, mask=None, log_prob=None, config=CFG, mode="token-mean", **kw):
    log_ratio = torch.as_tensor(log_ratio, dtype=torch.float64)
    advantages = torch.as_tensor(advantages, dtype=torch.float64)
    log_prob = torch.full_like(log_ratio, -1.0) if log_prob is None else torch.as_tensor(log_prob, dtype=torch.float64)
    mask = torch.ones_like(log_ratio) if mask is None else torch.as_tensor(mask, dtype=torch.float64)
    return get_policy_loss_fn(name)(log_prob - log_ratio, log_prob, advantages, mask, mode, config, **kw)


# ------------------------------------------------------------------ agg_loss
LOSS = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
AGG_MASK = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])


@pytest.mark.parametrize(
    "mode, kwargs, expected",
    [
        ("token-mean", {}, 7 / 3),  # (1 + 2 + 4) / 3 valid tokens
        ("token-mean", {"num_tokens": 7}, 1.0),  # a micro-batch's share of a 7-token mini-batch
        ("seq-mean-token-sum", {}, 3.5),  # (1+2, 4) -> (3 + 4) / 2
        ("seq-mean-token-sum", {"num_seqs": 4}, 1.75),  # (3 + 4) / 4
        ("seq-mean-token-mean", {}, 2.75),  # (3/2, 4/1) -> (1.5 + 4) / 2
        ("seq-mean-token-sum-norm", {}, 7 / 6),  # (3/3 + 4/3) / 2, constant = T = 3
        ("seq-mean-token-sum-norm", {"norm_constant": 4}, 0.875),  # (3/4 + 4/4) / 2
    ],
)
def test_agg_loss(mode, kwargs, expected):
    assert agg_loss(LOSS, AGG_MASK, mode, **kwargs).item() == pytest.approx(expected)


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"])
def test_agg_loss_ignores_nan_and_inf_at_masked_positions(mode):
    poisoned = LOSS.clone()
    poisoned[0, 2], poisoned[1, 1], poisoned[1, 2] = float("nan"), float("inf"), float("-inf")  # all masked out
    assert agg_loss(poisoned, AGG_MASK, mode).item() == pytest.approx(agg_loss(LOSS, AGG_MASK, mode).item())


@pytest.mark.parametrize(
    "mode, expected",
    [
        ("seq-mean-token-sum", 3.5),  # rows (3, 4, empty): the empty row is not a sequence -> 7 / 2
        ("seq-mean-token-mean", 2.75),  # (1.5 + 4) / 2, not / 3
        ("seq-mean-token-sum-norm", 7 / 6),  # (3/3 + 4/3) / 2
        ("token-mean", 7 / 3),
    ],
)
def test_seq_mean_leaves_fully_masked_rows_out(mode, expected):
    loss_mat = torch.cat([LOSS, torch.full((1, 3), float("nan"))])
    mask = torch.cat([AGG_MASK, torch.zeros(1, 3)])
    assert agg_loss(loss_mat, mask, mode).item() == pytest.approx(expected)


def test_agg_loss_unknown_mode():
    with pytest.raises(ValueError, match="unknown loss_agg_mode 'mean'"):
        agg_loss(LOSS, AGG_MASK, "mean")


# ------------------------------------------------------------------ vanilla PPO
def test_vanilla_clip_and_dual_clip():
    # token 1: A=+1, ratio e^0.1 = 1.10517 inside [0.8, 1.2] -> loss -1.10517
    # token 2: A=+1, ratio 1.5 -> clipped to 1.2 -> max(-1.5, -1.2) = -1.2 (clipped)
    # token 3: A=-1, ratio 0.5 -> max(0.5, 0.8) = 0.8 (clipped); dual: min(3, 0.8) = 0.8
    # token 4: A=-1, ratio 4 -> max(4, 1.2) = 4; dual-clip: min(3, 4) = 3 (clipped from below)
    log_ratio = [[0.1, math.log(1.5), math.log(0.5), math.log(4.0)]]
    pg_loss, clipfrac, ppo_kl, clipfrac_lower = loss("vanilla", log_ratio, [[1.0, 1.0, -1.0, -1.0]])
    assert pg_loss.item() == pytest.approx((-math.exp(0.1) - 1.2 + 0.8 + 3.0) / 4)
    assert clipfrac.item() == pytest.approx(0.5)  # tokens 2 and 3
    assert clipfrac_lower.item() == pytest.approx(0.25)  # token 4
    assert ppo_kl.item() == pytest.approx(-sum(log_ratio[0]) / 4)  # mean of log(pi_old / pi)


def test_vanilla_clip_higher():
    # DAPO clip-higher: ratio 1.5 with clip_ratio_high 0.28 is clipped to 1.28, not 1.2
    cfg = ActorConfig(clip_ratio=0.2, clip_ratio_high=0.28)
    pg_loss, *_ = loss("vanilla", [[math.log(1.5)]], [[1.0]], config=cfg)
    assert pg_loss.item() == pytest.approx(-1.28)
    # ratio 0.7 with A=-1: the low side still clips at 1 - 0.2 = 0.8
    pg_loss, *_ = loss("vanilla", [[math.log(0.7)]], [[-1.0]], config=cfg)
    assert pg_loss.item() == pytest.approx(0.8)


def test_vanilla_gradient_is_zero_when_clipped():
    log_prob = torch.tensor([[-1.0, -1.0]], dtype=torch.float64, requires_grad=True)
    old = torch.tensor([[-1.0 - math.log(1.5), -1.0]], dtype=torch.float64)  # ratios 1.5 (clipped) and 1
    pg_loss, *_ = get_policy_loss_fn("vanilla")(old, log_prob, torch.ones(1, 2, dtype=torch.float64),
                                                torch.ones(1, 2, dtype=torch.float64), "token-mean", CFG)
    pg_loss.backward()
    # clipped token: no gradient; unclipped: d(-ratio)/dlogp / 2 tokens = -1 * 1 / 2
    assert log_prob.grad.tolist() == [[0.0, -0.5]]


def test_vanilla_rejects_bad_dual_clip():
    with pytest.raises(ValueError, match="clip_ratio_c must be > 1"):
        loss("vanilla", [[0.0]], [[1.0]], config=ActorConfig(clip_ratio_c=1.0))


def test_rollout_is_weights_scale_the_loss():
    # ratio 1, A=+1: loss -1 per token; TIS weights (2, 0.5) -> (-2 - 0.5) / 2
    pg_loss, *_ = loss("vanilla", [[0.0, 0.0]], [[1.0, 1.0]],
                       rollout_is_weights=torch.tensor([[2.0, 0.5]], dtype=torch.float64))
    assert pg_loss.item() == pytest.approx(-1.25)


# ------------------------------------------------------------------ GSPO, CISPO, GPG, GMPO, SAPO
def test_gspo_sequence_ratio():
    # seq 1: token log-ratios (0.1, 0.3) -> mean 0.2 -> ratio e^0.2 = 1.2214 > 1.2: A=+1 -> -1.2 per token
    # seq 2: (-0.1, masked) -> ratio e^-0.1 = 0.904837 inside the range: A=-1 -> +0.904837
    # seq-mean-token-mean: (-1.2 + 0.904837) / 2
    pg_loss, clipfrac, _, lower = loss("gspo", [[0.1, 0.3], [-0.1, 0.05]], [[1.0, 1.0], [-1.0, -1.0]],
                                       mask=[[1, 1], [1, 0]])
    assert pg_loss.item() == pytest.approx((-1.2 + math.exp(-0.1)) / 2)
    assert clipfrac.item() == pytest.approx(2 / 3) and lower.item() == 0.0


def test_gspo_gradient_flows_per_token():
    # unclipped sequence: d loss / d logp_t = -A * s / (len * seqs): s = 1, len 2, one sequence -> -0.25
    log_prob = torch.tensor([[-1.0, -2.0]], dtype=torch.float64, requires_grad=True)
    pg_loss, *_ = get_policy_loss_fn("gspo")(log_prob.detach().clone(), log_prob, torch.ones(1, 2, dtype=torch.float64),
                                             torch.ones(1, 2, dtype=torch.float64), "token-mean", CFG)
    pg_loss.backward()
    assert torch.allclose(log_prob.grad, torch.tensor([[-0.5, -0.5]], dtype=torch.float64))
    # per token the ratio's value is the sequence ratio (1) and its gradient that of log_prob: -A * 1,
    # averaged over the 2 tokens of the sequence -> -0.5 each


def test_cispo_keeps_gradient_on_clipped_tokens():
    # token 1: A=+1, ratio 1.5 -> sg(clip) = 1.2, log_prob -0.5: loss -1 * 1.2 * -0.5 = 0.6
    # token 2: A=-1, ratio 1, log_prob -1: loss 1 * 1 * -1 = -1 -> token-mean (0.6 - 1) / 2 = -0.2
    log_prob = torch.tensor([[-0.5, -1.0]], dtype=torch.float64, requires_grad=True)
    old = torch.tensor([[-0.5 - math.log(1.5), -1.0]], dtype=torch.float64)
    pg_loss, clipfrac, _, lower = get_policy_loss_fn("cispo")(old, log_prob, torch.tensor([[1.0, -1.0]],
                                                              dtype=torch.float64), torch.ones(1, 2, dtype=torch.float64),
                                                              "token-mean", CFG)
    assert pg_loss.item() == pytest.approx(-0.2)
    pg_loss.backward()
    # gradient -A * sg(clip(ratio)) / 2: (-1.2 / 2, 1 / 2) - the clipped token still learns
    assert torch.allclose(log_prob.grad, torch.tensor([[-0.6, 0.5]], dtype=torch.float64))
    assert clipfrac.item() == pytest.approx(0.5) and lower.item() == 0.0


def test_cispo_clipfrac_counts_either_side_as_verl():
    """verl's pg_clipfrac is the share of tokens whose ratio was clipped on either side, and CISPO's
    pg_clipfrac_lower is 0 (it has no dual clip)."""
    # ratios e^0.5 = 1.65 > 1.2 (clipped above) and e^-0.5 = 0.61 < 0.8 (clipped below): 2 of 2 clipped
    pg_loss, clipfrac, _, lower = loss("cispo", [[0.5, -0.5]], [[1.0, 1.0]])
    assert clipfrac.item() == pytest.approx(1.0) and lower.item() == 0.0
    # one token inside [0.8, 1.2] (ratio e^0.1 = 1.105), one below: 1 of 2
    _, clipfrac, _, lower = loss("cispo", [[0.1, -0.5]], [[1.0, -1.0]])
    assert clipfrac.item() == pytest.approx(0.5) and lower.item() == 0.0


def test_gpg():
    # -A * log_prob: (-2 * -0.5, 1 * -1) = (1, -1) -> mean 0
    pg_loss, *_ = loss("gpg", [[0.3, -0.2]], [[2.0, -1.0]], log_prob=[[-0.5, -1.0]])
    assert pg_loss.item() == pytest.approx(0.0)


def test_geo_mean():
    cfg = ActorConfig(clip_ratio=0.4)
    # seq 1, A=+1: log-ratios (0.1, 0.6) clipped to (0.1, 0.4) -> mean 0.25 -> loss -e^0.25
    # seq 2, A=-1: (-0.6, 0.2): pessimistic for A<0 keeps the larger ratio where clipping would
    #   lower it: -0.6 -> -0.4; 0.2 stays -> mean -0.1 -> loss +e^-0.1
    pg_loss, clipfrac, _, lower = loss("geo_mean", [[0.1, 0.6], [-0.6, 0.2]], [[1.0, 1.0], [-1.0, -1.0]], config=cfg)
    assert pg_loss.item() == pytest.approx((-math.exp(0.25) + math.exp(-0.1)) / 2)
    assert clipfrac.item() == pytest.approx(0.25) and lower.item() == pytest.approx(0.25)


def test_sapo_soft_gate():
    # ratio 1: gate = sigmoid(0) * 4 / tau = 2 / tau; A=+1 (tau_pos 1) -> -2; A=-1 (tau_neg 1.05) -> +2/1.05
    log_prob = torch.tensor([[-1.0, -1.0]], dtype=torch.float64, requires_grad=True)
    pg_loss, *_ = get_policy_loss_fn("sapo")(log_prob.detach().clone(), log_prob,
                                             torch.tensor([[1.0, -1.0]], dtype=torch.float64),
                                             torch.ones(1, 2, dtype=torch.float64), "token-mean", CFG)
    assert pg_loss.item() == pytest.approx((-2.0 + 2.0 / 1.05) / 2)
    pg_loss.backward()
    # at ratio 1 the gate's slope is 4 * sigmoid'(0) = 1, like the plain ratio: grad -A / 2
    assert torch.allclose(log_prob.grad, torch.tensor([[-0.5, 0.5]], dtype=torch.float64))


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"])
def test_sapo_aggregates_seq_mean_token_mean_whatever_loss_agg_mode_says(mode):
    """verl's SAPO, like GSPO, always aggregates seq-mean-token-mean. With token-mean the sign flips here."""
    # row 1: one token, log-ratio 0.1 (ratio e^0.1 = 1.10517), A = +1, tau_pos 1:
    #   gate = 4 * sigmoid(0.10517) = 4 * 0.52627 = 2.10508 -> loss -2.10508
    # row 2: three tokens, ratio 1, A = -1, tau_neg 1.05: gate = 4 * sigmoid(0) / 1.05 = 1.90476 -> loss +1.90476 each
    # seq-mean-token-mean: (-2.10508 + 1.90476) / 2 = -0.10016
    # (token-mean would give (-2.10508 + 3 * 1.90476) / 4 = +0.9023: the sign flips)
    row1 = -4.0 / (1.0 + math.exp(-(math.exp(0.1) - 1.0)))
    row2 = 2.0 / 1.05
    expected = (row1 + row2) / 2
    assert expected == pytest.approx(-0.10016, abs=1e-5)
    args = ([[0.1, 0.0, 0.0], [0.0, 0.0, 0.0]],  # log-ratios
            [[1.0, 0.0, 0.0], [-1.0, -1.0, -1.0]],  # advantages
            [[1.0, 0.0, 0.0], [1.0, 1.0, 1.0]])  # mask
    pg_loss, clipfrac, _, lower = loss("sapo", *args, mode=mode)
    assert pg_loss.item() == pytest.approx(expected, rel=1e-6)
    assert clipfrac.item() == 0.0 and lower.item() == 0.0
    # as micro-batches of one row each, given the mini-batch's totals (2 sequences): the shares add up
    shares = [loss("sapo", [log_ratio], [adv], [mask], mode=mode, num_tokens=4.0, num_seqs=2, norm_constant=3)[0].item()
              for log_ratio, adv, mask in zip(*args)]
    assert sum(shares) == pytest.approx(expected, rel=1e-6)


# ------------------------------------------------------------------ gradcheck, registry, TIS
def random_inputs(seed=0, seq_level_adv=False):
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(3, 4, generator=g, dtype=torch.float64) - 0.1
    log_prob = (old + 0.3 * torch.randn(3, 4, generator=g, dtype=torch.float64)).requires_grad_(True)
    adv = torch.randn(3, 1 if seq_level_adv else 4, generator=g, dtype=torch.float64).expand(3, 4)
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0], [1, 1, 1, 0]], dtype=torch.float64)
    return old, log_prob, adv, mask


# GSPO's stop-gradient trick has the gradient of the plain sequence ratio when the advantage
# is constant over a sequence (as GRPO's is), so gradcheck holds there.
@pytest.mark.parametrize("name, seq_adv", [("vanilla", False), ("gspo", True), ("gpg", False),
                                           ("geo_mean", True), ("sapo", False)])
def test_gradcheck(name, seq_adv):
    old, log_prob, adv, mask = random_inputs(seq_level_adv=seq_adv)
    fn = get_policy_loss_fn(name)
    assert torch.autograd.gradcheck(lambda lp: fn(old, lp, adv, mask, "token-mean", CFG)[0], (log_prob,))


def test_cispo_gradient_closed_form():
    # CISPO detaches the clipped ratio on purpose, so its gradient is -A * clip(ratio) / N, which
    # differs from the numerical derivative of its value: check the closed form instead.
    old, log_prob, adv, mask = random_inputs()
    pg_loss, *_ = get_policy_loss_fn("cispo")(old, log_prob, adv, mask, "token-mean", CFG)
    pg_loss.backward()
    clipped = torch.exp(log_prob.detach() - old).clamp(0.8, 1.2)
    assert torch.allclose(log_prob.grad, -adv * clipped * mask / mask.sum())


def test_policy_loss_registry():
    assert set(POLICY_LOSSES.names()) >= {"vanilla", "gspo", "cispo", "gpg", "geo_mean", "sapo"}
    with pytest.raises(ValueError, match=r"unknown policy loss 'ppo'; registered: \[.*'vanilla'"):
        get_policy_loss_fn("ppo")
    with pytest.raises(ValueError, match="'vanilla' is already registered"):
        register_policy_loss("vanilla")(lambda *a: None)


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"])
def test_a_loss_with_verls_signature_equals_one_given_the_totals(mode):
    """A loss written with verl's signature aggregates over its micro-batch alone; weighed by its
    share it equals rlvr's, in every mode: seq-mean-token-sum-norm included, whose verl-style loss
    divides by the padded width (4 here), rlvr's by max_response_length (10)."""
    from rlvr.algos.losses import agg_loss, call_policy_loss, count_seqs

    old = torch.tensor([[-1.0, -2.0, -1.5, 0.0], [-0.5, -1.0, 0.0, 0.0]])
    new = old + torch.tensor([[0.1, -0.2, 0.05, 0.0], [0.0, 0.3, 0.0, 0.0]])
    adv = torch.tensor([[1.0, 1.0, 1.0, 0.0], [-0.5, -0.5, 0.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0], [1.0, 1.0, 0.0, 0.0]])

    def verl_style(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, config, rollout_is_weights=None):
        return agg_loss(-advantages * torch.exp(log_prob - old_log_prob), response_mask, loss_agg_mode), {}

    def rlvr_style(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, config, rollout_is_weights=None,
                   num_tokens=None, num_seqs=None, norm_constant=None):
        return agg_loss(-advantages * torch.exp(log_prob - old_log_prob), response_mask, loss_agg_mode, num_tokens,
                        num_seqs, norm_constant), 0, 0, 0

    totals = {"num_tokens": mask.sum() + 3, "num_seqs": count_seqs(mask) + 1, "norm_constant": 10}  # a larger mini-batch
    theirs = call_policy_loss(verl_style, old, new, adv, mask, mode, None, **totals)[0]
    ours = call_policy_loss(rlvr_style, old, new, adv, mask, mode, None, **totals)[0]
    assert theirs.item() == pytest.approx(ours.item(), rel=1e-6)


@pytest.mark.parametrize("metrics, expected", [
    ({"actor/pg_clipfrac": 0.25, "actor/ppo_kl": 0.1, "actor/pg_clipfrac_lower": 0.05}, (0.25, 0.1, 0.05)),
    ({}, (0.0, 0.0, 0.0)),  # verl's gpg loss returns an empty dict
])
def test_a_loss_returning_verls_loss_and_metrics_dict_gives_rlvrs_four_values(metrics, expected):
    """verl's policy losses return (pg_loss, {"actor/pg_clipfrac": ..., "actor/ppo_kl": ...,
    "actor/pg_clipfrac_lower": ...}) (core_algos.PolicyLossFn); the actor unpacks four values, each a tensor."""
    from rlvr.algos.losses import call_policy_loss

    def verl_loss(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode="token-mean", config=None,
                  rollout_is_weights=None):
        return agg_loss(loss_mat=-advantages * torch.exp(log_prob - old_log_prob), loss_mask=response_mask,
                        loss_agg_mode=loss_agg_mode), dict(metrics)

    mask, adv, logp = torch.ones(2, 3), torch.ones(2, 3), torch.zeros(2, 3)
    # ratio 1, A 1: token-mean over its 6 tokens is -1; its share of a 12-token mini-batch is 6/12 -> -0.5
    out = call_policy_loss(verl_loss, logp, logp, adv, mask, "token-mean", None,
                           num_tokens=torch.tensor(12.0), num_seqs=4, norm_constant=3)
    assert len(out) == 4 and all(isinstance(v, torch.Tensor) for v in out)
    pg_loss, clipfrac, ppo_kl, clipfrac_lower = out
    assert pg_loss.item() == pytest.approx(-0.5)
    assert (clipfrac.item(), ppo_kl.item(), clipfrac_lower.item()) == pytest.approx(expected)
    # without totals (one micro-batch is the mini-batch) the loss is its own: -1
    assert call_policy_loss(verl_loss, logp, logp, adv, mask, "token-mean", None)[0].item() == pytest.approx(-1.0)


def test_a_loss_returning_something_else_names_itself_and_the_expected_shape():
    from rlvr.algos.losses import call_policy_loss

    def three_values(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, config, rollout_is_weights=None):
        return log_prob.sum(), 0.0, 0.0

    ones = torch.ones(1, 2)
    with pytest.raises(ValueError, match=r"three_values.*3 values.*\(pg_loss, pg_clipfrac, ppo_kl, pg_clipfrac_lower\)"):
        call_policy_loss(three_values, ones, ones, ones, ones, "token-mean", None)


def test_geo_mean_folds_rollout_weights_in_as_verls_geometric_mean_with_its_epsilon():
    """verl: seq weight = exp(sum(log(w + 1e-10) * mask) / (len + 1e-8)); a weight IcePop zeroed counts as 1e-10."""
    # one sequence, 2 tokens, ratio 1, A = +1; weights (1, 0):
    #   exp((log(1 + 1e-10) + log(1e-10)) / 2) = exp(-23.02585 / 2) = 1e-5 -> loss -1e-5
    pg_loss, *_ = loss("geo_mean", [[0.0, 0.0]], [[1.0, 1.0]], rollout_is_weights=torch.tensor([[1.0, 0.0]]))
    assert pg_loss.item() == pytest.approx(-1e-5, rel=1e-6)
    # weights (4, 1): exp((log 4 + log 1) / 2) = 2 -> loss -2
    pg_loss, *_ = loss("geo_mean", [[0.0, 0.0]], [[1.0, 1.0]], rollout_is_weights=torch.tensor([[4.0, 1.0]]))
    assert pg_loss.item() == pytest.approx(-2.0, rel=1e-6)
