"""KL estimators between the policy and the reference, KL controllers, KL-in-reward.

Estimators of KL(pi || pi_ref) per token from log-probs (x = logp - ref_logp):

- ``kl`` / ``k1``: x
- ``abs``: |x|
- ``mse`` / ``k2``: x^2 / 2
- ``low_var_kl`` / ``k3``: exp(-x) + x - 1, Schulman's unbiased low-variance estimator
  (http://joschu.net/blog/kl-approx.html), clamped to [-10, 10] as verl does. One seed
  document shows a different piecewise formula; this is the correct one.
- ``full``: sum_v p(v) (log p(v) - log q(v)) from full log-distributions (..., V).
- ``k1+``/``kl+``, ``k3+``/``low_var_kl+``, ``abs+`` (``KL_TYPES``; no ``k2+``, whose gradient is already k2's): straight-through: the value of the named estimator,
  the gradient of k2 (which is the unbiased gradient of the KL).
"""

from __future__ import annotations

import torch

from rlvr.algos.utils import masked_mean

KL_TYPES = ("kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3", "full", "k1+", "k3+", "low_var_kl+", "kl+", "abs+")


def _kl_value(logprob: torch.Tensor, ref_logprob: torch.Tensor, kind: str) -> torch.Tensor:
    if kind in ("kl", "k1"):
        return logprob - ref_logprob
    if kind == "abs":
        return (logprob - ref_logprob).abs()
    if kind in ("mse", "k2"):
        return 0.5 * (logprob - ref_logprob).square()
    if kind in ("low_var_kl", "k3"):
        log_ratio = torch.clamp(ref_logprob - logprob, min=-20.0, max=20.0)  # log(pi_ref / pi)
        return torch.clamp(torch.exp(log_ratio) - log_ratio - 1.0, min=-10.0, max=10.0)
    if kind == "full":
        return (logprob.exp() * (logprob - ref_logprob)).sum(dim=-1)
    raise ValueError(f"unknown KL estimator {kind!r}; choose one of {list(KL_TYPES)}")


def kl_penalty(logprob: torch.Tensor, ref_logprob: torch.Tensor, kl_penalty: str) -> torch.Tensor:
    """Per-token KL estimate (see the module docstring for the names)."""
    if not kl_penalty.endswith("+"):
        return _kl_value(logprob, ref_logprob, kl_penalty)
    value = _kl_value(logprob, ref_logprob, kl_penalty[:-1])
    k2 = 0.5 * (logprob - ref_logprob).square()
    return k2 - k2.detach() + value.detach()  # value of the estimator, gradient of k2


class FixedKLController:
    """A constant KL coefficient."""

    def __init__(self, kl_coef: float):
        self.value = kl_coef

    def update(self, current_kl: float, n_steps: int) -> None:
        pass


class AdaptiveKLController:
    """Ziegler et al. (2019): move the coefficient toward a target KL, at most 20% per horizon."""

    def __init__(self, init_kl_coef: float, target_kl: float, horizon: int):
        self.value, self.target, self.horizon = init_kl_coef, target_kl, horizon

    def update(self, current_kl: float, n_steps: int) -> None:
        error = min(max(current_kl / self.target - 1.0, -0.2), 0.2)
        self.value *= 1.0 + error * n_steps / self.horizon


def get_kl_controller(config) -> FixedKLController | AdaptiveKLController:
    """From ``algorithm.kl_ctrl`` (type, kl_coef, target_kl, horizon)."""
    if config.type == "fixed":
        return FixedKLController(config.kl_coef)
    if config.type == "adaptive":
        if config.horizon <= 0:
            raise ValueError(f"algorithm.kl_ctrl.horizon must be > 0, got {config.horizon}")
        return AdaptiveKLController(config.kl_coef, config.target_kl, config.horizon)
    raise ValueError(f"unknown algorithm.kl_ctrl.type {config.type!r}; choose fixed or adaptive")


def apply_kl_penalty(token_level_scores, old_log_probs, ref_log_prob, response_mask, kl_ctrl,
                     kl_penalty_type: str = "kl"):
    """token_level_rewards = scores - beta * KL per token; updates the controller.

    Returns (token_level_rewards, metrics) with verl's metric names.
    """
    kld = kl_penalty(old_log_probs, ref_log_prob, kl_penalty_type)  # (bs, T); masked positions selected away,
    kld = torch.where(response_mask.bool(), kld, torch.zeros_like(kld)) * response_mask  # not x 0 (NaN x 0 is NaN)
    beta = kl_ctrl.value
    rewards = token_level_scores - beta * kld
    current_kl = float(masked_mean(kld, response_mask, dim=-1).mean())  # mean over samples of per-sample mean
    kl_ctrl.update(current_kl, n_steps=token_level_scores.shape[0])
    return rewards, {"actor/reward_kl_penalty": current_kl, "actor/reward_kl_penalty_coeff": beta}
