"""Loss aggregation and the policy losses behind one registry and one signature.

Every policy loss is called as::

    fn(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, config,
       rollout_is_weights=None, **agg_kwargs)
       -> (pg_loss, pg_clipfrac, ppo_kl, pg_clipfrac_lower)

``config`` is the actor config (``clip_ratio``, ``clip_ratio_low``, ``clip_ratio_high``,
``clip_ratio_c``, ``policy_loss.tau_pos``/``tau_neg``). ``agg_kwargs`` (``num_tokens``,
``num_seqs``, ``norm_constant``) carry the mini-batch totals that make a micro-batch's loss
a share of the mini-batch loss, so the optimizer step's gradient does not depend on how
the mini-batch is split (see ``agg_loss``).

GSPO and SAPO aggregate ``seq-mean-token-mean`` whatever ``loss_agg_mode`` says, and GMPO
(``geo_mean``) takes the mean over sequences of its sequence losses, as verl's do
(``OWN_AGGREGATION``); ``loss_agg_mode`` still aggregates the entropy and KL terms.

Departures from verl: ``seq-mean-token-sum-norm`` is the Dr.GRPO paper's
mean over sequences of (token sum / constant); verl divides the sum over sequences by the
constant without dividing by the number of sequences. ``geo_mean`` divides by the sequences
with a valid token, verl by every row (a fully masked row, a dropped group's, counts there).
"""

from __future__ import annotations

import functools
import inspect
from typing import Callable

import torch

from rlvr.registry import Registry
from rlvr.algos.utils import masked_mean, masked_sum

LOSS_AGG_MODES = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")
# policy losses whose aggregation belongs to their definition (verl's too): loss_agg_mode does not reach them
OWN_AGGREGATION = {"gspo": "seq-mean-token-mean", "sapo": "seq-mean-token-mean",
                   "geo_mean": "seq-mean (each sequence's -A x its geometric-mean ratio)"}


def agg_loss(loss_mat: torch.Tensor, loss_mask: torch.Tensor, loss_agg_mode: str,
             num_tokens: float | torch.Tensor | None = None, num_seqs: int | None = None,
             norm_constant: float | None = None) -> torch.Tensor:
    """Reduce a (bs, T) loss matrix to a scalar.

    - token-mean: sum of token losses / ``num_tokens`` (default: valid tokens here);
    - seq-mean-token-sum: mean over sequences of each sequence's token sum;
    - seq-mean-token-mean: mean over sequences of each sequence's token mean;
    - seq-mean-token-sum-norm: mean over sequences of token sum / ``norm_constant``
      (Dr.GRPO; default the padded length T, pass max_response_length to keep it constant).

    Masked-out positions never contribute (a NaN there stays out), and the seq-mean modes
    count only sequences with at least one valid token, as verl does.

    Pass the whole mini-batch's ``num_tokens`` / ``num_seqs`` when ``loss_mat`` is one
    micro-batch: the micro-batch losses then sum to the mini-batch loss.
    """
    if loss_agg_mode == "token-mean":
        denom = loss_mask.sum() if num_tokens is None else num_tokens
        return masked_sum(loss_mat, loss_mask) / torch.clamp(torch.as_tensor(denom, dtype=loss_mat.dtype), min=1.0)
    seqs = count_seqs(loss_mask) if num_seqs is None else num_seqs
    token_sums = masked_sum(loss_mat, loss_mask, dim=-1)  # (bs,)
    if loss_agg_mode == "seq-mean-token-sum":
        per_seq = token_sums
    elif loss_agg_mode == "seq-mean-token-mean":
        per_seq = token_sums / loss_mask.sum(dim=-1).clamp(min=1)
    elif loss_agg_mode == "seq-mean-token-sum-norm":
        per_seq = token_sums / (norm_constant if norm_constant is not None else loss_mask.shape[-1])
    else:
        raise ValueError(f"unknown loss_agg_mode {loss_agg_mode!r}; choose one of {list(LOSS_AGG_MODES)}")
    return per_seq.sum() / max(seqs, 1)


def count_seqs(loss_mask: torch.Tensor) -> int:
    """Sequences with at least one valid token: the divisor of the seq-mean modes."""
    return int((loss_mask.sum(dim=-1) > 0).sum())


PolicyLossFn = Callable[..., tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]]
POLICY_LOSSES: Registry[PolicyLossFn] = Registry("policy loss")
register_policy_loss = POLICY_LOSSES.register


def get_policy_loss_fn(name: str) -> PolicyLossFn:
    return POLICY_LOSSES.get(name)


@functools.lru_cache(maxsize=None)  # asked once per micro-batch: inspect each function once
def _takes_totals(fn: Callable) -> bool:
    """Whether ``fn`` accepts the mini-batch totals (rlvr's losses do; verl's signature does not)."""
    params = inspect.signature(fn).parameters.values()
    return any(p.kind is p.VAR_KEYWORD for p in params) or "num_tokens" in {p.name for p in params}


def call_policy_loss(fn: PolicyLossFn, old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, config,
                     rollout_is_weights=None, **totals):
    """Call a registered policy loss on one micro-batch, so that its loss is the micro-batch's
    share of the mini-batch loss.

    A loss with verl's signature ``(old_log_prob, log_prob, advantages, response_mask,
    loss_agg_mode, config, rollout_is_weights)``, returning rlvr's four values or verl's
    ``(pg_loss, metrics)``, aggregates over the micro-batch alone; its
    loss is then weighed by the micro-batch's share of the mini-batch's tokens (token-mean) or
    sequences (the seq-mean modes), which gives the same gradient for these modes."""
    if _takes_totals(fn):
        return _four_values(fn, fn(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, config,
                                   rollout_is_weights=rollout_is_weights, **totals))
    pg_loss, *rest = _four_values(fn, fn(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, config,
                                         rollout_is_weights))
    if not totals:
        return (pg_loss, *rest)
    if loss_agg_mode == "token-mean":
        share = response_mask.sum() / torch.as_tensor(totals["num_tokens"], dtype=response_mask.dtype)
    else:
        share = count_seqs(response_mask) / max(totals["num_seqs"], 1)
    if loss_agg_mode == "seq-mean-token-sum-norm" and totals.get("norm_constant"):
        # its agg_loss divided by the padded width (the step's longest response); rlvr's by max_response_length
        share = share * response_mask.shape[-1] / totals["norm_constant"]
    return (pg_loss * share, *rest)


def _four_values(fn: Callable, result) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """rlvr's (pg_loss, pg_clipfrac, ppo_kl, pg_clipfrac_lower), each a tensor, from rlvr's four
    values or verl's (pg_loss, metrics) with its ``actor/pg_clipfrac``, ``actor/ppo_kl`` and
    ``actor/pg_clipfrac_lower`` (0 where a loss leaves one out: verl's gpg returns {})."""
    if isinstance(result, (tuple, list)) and len(result) == 2 and isinstance(result[1], dict):
        pg_loss, metrics = result
        result = (pg_loss, *(metrics.get(f"actor/{key}", 0.0)
                             for key in ("pg_clipfrac", "ppo_kl", "pg_clipfrac_lower")))
    if not isinstance(result, (tuple, list)) or len(result) != 4:
        raise ValueError(f"policy loss {getattr(fn, '__qualname__', fn)!r} returned {type(result).__name__} "
                         f"{'of ' + str(len(result)) + ' values ' if isinstance(result, (tuple, list)) else ''}"
                         "where (pg_loss, pg_clipfrac, ppo_kl, pg_clipfrac_lower) or verl's (pg_loss, metrics dict) "
                         "is expected")
    pg_loss, *rest = result
    return (pg_loss, *(torch.as_tensor(v, dtype=torch.float32).detach() if not isinstance(v, torch.Tensor) else v
                       for v in rest))


def clip_range(config) -> tuple[float, float]:
    """(low, high) clip ranges; each falls back to ``clip_ratio`` when unset."""
    low = config.clip_ratio_low if config.clip_ratio_low is not None else config.clip_ratio
    high = config.clip_ratio_high if config.clip_ratio_high is not None else config.clip_ratio
    return low, high


def _log_ratio(old_log_prob, log_prob):
    """log(pi / pi_old), clamped to [-20, 20] so exp() stays finite (as verl does)."""
    return torch.clamp(log_prob - old_log_prob, min=-20.0, max=20.0)


def _zero(like: torch.Tensor) -> torch.Tensor:
    return torch.zeros((), dtype=like.dtype, device=like.device)


def _weighted(pg_losses, rollout_is_weights):
    return pg_losses if rollout_is_weights is None else pg_losses * rollout_is_weights


@register_policy_loss("vanilla")
def compute_policy_loss_vanilla(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, config,
                                rollout_is_weights=None, **agg_kwargs):
    """PPO clip (asymmetric with clip_ratio_low/high: DAPO clip-higher) and dual-clip for A < 0."""
    low, high = clip_range(config)
    clip_c = config.clip_ratio_c
    if clip_c <= 1.0:
        raise ValueError(f"clip_ratio_c must be > 1 for dual-clip, got {clip_c}")
    neg_kl = _log_ratio(old_log_prob, log_prob)
    ratio = torch.exp(neg_kl)
    ppo_kl = masked_mean(-neg_kl, response_mask)
    losses1 = -advantages * ratio
    losses2 = -advantages * torch.clamp(ratio, 1 - low, 1 + high)
    clipped = torch.maximum(losses1, losses2)
    pg_clipfrac = masked_mean(torch.gt(losses2, losses1).float(), response_mask)
    losses3 = -advantages * clip_c  # dual clip: bound the loss of a negative advantage
    dual = torch.minimum(losses3, clipped)
    pg_clipfrac_lower = masked_mean((torch.gt(clipped, losses3) & (advantages < 0)).float(), response_mask)
    pg_losses = _weighted(torch.where(advantages < 0, dual, clipped), rollout_is_weights)
    return agg_loss(pg_losses, response_mask, loss_agg_mode, **agg_kwargs), pg_clipfrac, ppo_kl, pg_clipfrac_lower


@register_policy_loss("gspo")
def compute_policy_loss_gspo(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, config,
                             rollout_is_weights=None, **agg_kwargs):
    """GSPO: the clipped ratio is the sequence's geometric-mean ratio (seq-mean-token-mean)."""
    low, high = clip_range(config)
    neg_kl = log_prob - old_log_prob
    lengths = response_mask.sum(dim=-1).clamp(min=1)
    seq_neg_kl = masked_sum(neg_kl, response_mask, dim=-1) / lengths  # (bs,); a NaN at a masked position stays out
    # s_i,t = sg[s_i] * pi(y_t) / sg[pi(y_t)]: the value of the sequence ratio, a per-token gradient
    log_ratio = log_prob - log_prob.detach() + seq_neg_kl.detach().unsqueeze(-1)
    ratio = torch.exp(torch.clamp(log_ratio, max=10.0))
    losses1 = -advantages * ratio
    losses2 = -advantages * torch.clamp(ratio, 1 - low, 1 + high)
    pg_losses = _weighted(torch.maximum(losses1, losses2), rollout_is_weights)
    agg_kwargs.pop("num_tokens", None)  # GSPO is defined per sequence
    pg_loss = agg_loss(pg_losses, response_mask, OWN_AGGREGATION["gspo"], **agg_kwargs)
    pg_clipfrac = masked_mean(torch.gt(losses2, losses1).float(), response_mask)
    return pg_loss, pg_clipfrac, masked_mean(-neg_kl, response_mask), _zero(pg_loss)


@register_policy_loss("cispo")
def compute_policy_loss_cispo(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, config,
                              rollout_is_weights=None, **agg_kwargs):
    """CISPO (MiniMax-M1): -sg(clip(ratio)) * A * log_prob; every token keeps a gradient.
    ``pg_clipfrac`` is verl's: the share of tokens clipped on either side; ``pg_clipfrac_lower`` 0."""
    low, high = clip_range(config)
    neg_kl = _log_ratio(old_log_prob, log_prob)
    ratio = torch.exp(neg_kl)
    clipped_ratio = torch.clamp(ratio, 1 - low, 1 + high).detach()
    pg_losses = _weighted(-advantages * clipped_ratio * log_prob, rollout_is_weights)
    pg_loss = agg_loss(pg_losses, response_mask, loss_agg_mode, **agg_kwargs)
    pg_clipfrac = masked_mean(torch.ne(ratio, clipped_ratio).float(), response_mask)
    return pg_loss, pg_clipfrac, masked_mean(-neg_kl, response_mask), _zero(pg_loss)


@register_policy_loss("gpg")
def compute_policy_loss_gpg(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, config,
                            rollout_is_weights=None, **agg_kwargs):
    """GPG: plain policy gradient -A * log_prob, no ratio and no clipping."""
    pg_losses = _weighted(-advantages * log_prob, rollout_is_weights)
    pg_loss = agg_loss(pg_losses, response_mask, loss_agg_mode, **agg_kwargs)
    return pg_loss, _zero(pg_loss), _zero(pg_loss), _zero(pg_loss)


@register_policy_loss("geo_mean")
def compute_policy_loss_geo_mean(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, config,
                                 rollout_is_weights=None, **agg_kwargs):
    """GMPO: the geometric mean of token ratios, each clipped in log space to [-low, high]."""
    low, high = clip_range(config)
    neg_kl = log_prob - old_log_prob
    ppo_kl = masked_mean(-neg_kl, response_mask)
    sign = torch.sign(advantages)
    neg_kl_clamped = torch.clamp(neg_kl, -low, high)
    # pessimistic per token: min(sign * x, sign * clip(x)) then undo the sign
    neg_kl_min = sign * torch.minimum(sign * neg_kl, sign * neg_kl_clamped)
    if rollout_is_weights is not None:
        # the weights' geometric mean over the sequence joins the ratio's; verl's 1e-10 keeps a zeroed weight finite
        neg_kl_min = neg_kl_min + torch.log(rollout_is_weights + 1e-10)
    lengths = response_mask.sum(dim=-1)
    ratio = torch.exp(masked_sum(neg_kl_min, response_mask, dim=-1) / (lengths + 1e-8))  # (bs,)
    seq_adv = masked_sum(advantages, response_mask, dim=-1) / (lengths + 1e-8)  # sequence-level advantage
    seqs = agg_kwargs.get("num_seqs") or count_seqs(response_mask)
    pg_loss = (-seq_adv * ratio).sum() / seqs
    clipped = torch.ne(neg_kl, neg_kl_clamped)
    pg_clipfrac = masked_mean((clipped & (advantages > 0)).float(), response_mask)
    pg_clipfrac_lower = masked_mean((clipped & (advantages < 0)).float(), response_mask)
    return pg_loss, pg_clipfrac, ppo_kl, pg_clipfrac_lower


@register_policy_loss("sapo")
def compute_policy_loss_sapo(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, config,
                             rollout_is_weights=None, **agg_kwargs):
    """SAPO: a smooth sigmoid gate 4/tau * sigmoid(tau (ratio - 1)) replaces the hard clip;
    aggregated seq-mean-token-mean whatever ``loss_agg_mode`` says, as verl's (and GSPO)."""
    tau_pos, tau_neg = config.policy_loss.tau_pos, config.policy_loss.tau_neg
    neg_kl = _log_ratio(old_log_prob, log_prob)
    ratio = torch.exp(neg_kl)
    tau = torch.where(advantages > 0, torch.full_like(ratio, tau_pos), torch.full_like(ratio, tau_neg))
    gate = torch.sigmoid(tau * (ratio - 1.0)) * (4.0 / tau)  # slope 1 at ratio 1, like the plain ratio
    pg_losses = _weighted(-gate * advantages, rollout_is_weights)
    agg_kwargs.pop("num_tokens", None)  # SAPO is aggregated per sequence
    pg_loss = agg_loss(pg_losses, response_mask, OWN_AGGREGATION["sapo"], **agg_kwargs)
    return pg_loss, _zero(pg_loss), masked_mean(-neg_kl, response_mask), _zero(pg_loss)
