"""Rollout correction (verl's ``algorithm.rollout_correction``): importance weights and
rejection masks for samples the trainer's policy did not generate itself.

The rollout engine's distribution pi_rollout can differ from the trainer's pi_old: another
numeric path (bf16 engine, fp32 actor), or older weights (async training). With
``log_ratio = log pi_old - log pi_rollout`` per response token:

- importance sampling (``rollout_is``): a weight per token (``token``), one per sequence
  (``sequence``: exp of the summed log ratio) or rlvr's ``geometric`` (exp of the mean log
  ratio, one per sequence), multiplied into the policy loss. ``rollout_is_threshold`` ``2.0``
  truncates the weights at 2 (TIS); ``"0.5_2.0"`` zeroes those outside [0.5, 2] (IcePop).
  ``rollout_is_batch_normalize`` divides them by their batch mean (per token, or per sequence).
- rejection sampling (``rollout_rs``, comma-separated options): a token or sequence whose
  divergence passes its ``rollout_rs_threshold`` leaves the loss mask. Per token,
  k1 = -log_ratio, k2 = log_ratio^2 / 2, k3 = exp(log_ratio) - 1 - log_ratio;
  ``token_k*`` judge each token, ``seq_sum_k*`` / ``seq_mean_k*`` / ``seq_max_k*`` the sum,
  mean or max over the sequence. A k1 option keeps a value inside [log lower, log upper]
  (threshold ``"lower_upper"``, or ``upper`` with lower = 1 / upper); k2 and k3 keep a
  value <= the upper bound.
- ``bypass_mode``: pi_old is pi_rollout (no old-log-prob pass); the weights and the rejection
  mask then compare the policy being trained with the rollout's, per micro-batch (so a rejected
  token leaves the policy loss only: the mini-batch's token and sequence totals, known before the
  forward, the entropy bonus and the KL loss still count it; decoupled mode rejects before the
  update, from every term), and
  ``loss_type`` picks the loss: ``ppo_clip`` (the ratio already carries the correction, so no
  weight is applied) or ``reinforce`` (-A * w * log pi, w the detached weight). With
  ``rollout_is_batch_normalize`` the weights are divided by their mean over the whole
  mini-batch, every micro-batch and rank (``batch_norm_sums``, from a forward without gradients
  before the optimizer step's), so the gradient does not depend on the split. Departure from
  verl: its bypass loss normalises within each micro-batch (across ranks).

Metrics (``rollout_corr/*``, verl's names): the weights' mean/max/min, share outside the bounds
(per token, or per sequence at the sequence levels), std and effective sample size, and their
per-sequence statistics, all taken before truncation as verl does (``weight_metrics``); each
rejection option's masked token and sequence shares; and the gap itself: ``kl``
(E[log pi_rollout - log pi_old]), ``k3_kl``, both perplexities, ``chi2_token`` and ``chi2_seq``.
"""

from __future__ import annotations

import math

import torch

from rlvr.algos.losses import agg_loss
from rlvr.algos.utils import masked_mean, masked_sum

IS_LEVELS = ("token", "sequence", "geometric")
RS_OPTIONS = ("token_k1", "token_k2", "token_k3", "seq_sum_k1", "seq_sum_k2", "seq_sum_k3",
              "seq_mean_k1", "seq_mean_k2", "seq_mean_k3", "seq_max_k2", "seq_max_k3")
LOSS_TYPES = ("ppo_clip", "reinforce")
SAFETY_BOUND = 20.0  # exp(+-20): the log ratios are clamped before exponentiation


def parse_is_threshold(spec) -> tuple[float, float | None]:
    """``2.0`` or ``"2.0"`` -> (2.0, None) (truncate); ``"0.5_2.0"`` -> (2.0, 0.5) (IcePop)."""
    if isinstance(spec, bool) or not isinstance(spec, (int, float, str)):
        raise ValueError(f"{spec!r} is not a threshold: give a number (truncate the weights there) or "
                         "'lower_upper' such as '0.5_2.0' (zero the weights outside)")
    lower = None
    try:
        if isinstance(spec, str) and "_" in spec:
            low, up = spec.split("_", 1)
            lower, upper = float(low), float(up)
        else:
            upper = float(spec)
    except ValueError:
        raise ValueError(f"{spec!r} is not a threshold: give a number or 'lower_upper' such as '0.5_2.0'") from None
    if upper <= 0 or (lower is not None and not 0 < lower <= upper):
        raise ValueError(f"threshold {spec!r}: the bounds must be positive, lower <= upper")
    return upper, lower


def parse_rs(options: str, spec) -> dict[str, tuple[float | None, float]]:
    """``rollout_rs`` and ``rollout_rs_threshold`` -> {option: (lower, upper)}: one threshold
    shared by every option or one per option (comma-separated); lower is None but for k1."""
    if not isinstance(options, str) or not options.strip():
        raise ValueError(f"rollout_rs={options!r}: give one or more of {', '.join(RS_OPTIONS)}, comma-separated")
    names = list(dict.fromkeys(o.strip() for o in options.split(",") if o.strip()))
    for name in names:
        if name not in RS_OPTIONS:
            raise ValueError(f"rollout_rs option {name!r} is not one of {', '.join(RS_OPTIONS)}")
    if spec is None or isinstance(spec, bool):
        raise ValueError("rollout_rs needs rollout_rs_threshold (one value, or one per option, comma-separated)")
    specs = [s.strip() for s in str(spec).split(",") if s.strip()]
    if len(specs) == 1:
        specs = specs * len(names)
    if len(specs) != len(names):
        raise ValueError(f"rollout_rs_threshold={spec!r} has {len(specs)} values for {len(names)} options "
                         f"({', '.join(names)}): give one shared value or one per option")
    out = {}
    for name, value in zip(names, specs):
        try:
            if name.endswith("k1"):
                low, up = value.split("_", 1) if "_" in value else (None, value)
                upper = float(up)
                lower = float(low) if low is not None else 1.0 / upper
            elif "_" in value:
                raise ValueError
            else:
                lower, upper = None, float(value)
        except (ValueError, ZeroDivisionError):
            kind = "a ratio 'lower_upper' or an upper ratio" if name.endswith("k1") else "one upper bound"
            raise ValueError(f"rollout_rs_threshold {value!r} for {name}: give {kind}") from None
        if upper <= 0 or (lower is not None and not 0 < lower <= upper):
            raise ValueError(f"rollout_rs_threshold {value!r} for {name}: the bounds must be positive, lower <= upper")
        out[name] = (lower, upper)
    return out


def _seq_valid(mask: torch.Tensor) -> torch.Tensor:
    return mask.sum(-1) > 0


def _weights_and_logs(log_ratio: torch.Tensor, mask: torch.Tensor, level: str, threshold):
    """(raw weights, truncated or zeroed weights, upper, lower, the log of each weight before the safety
    clamp), (bs, T), 0 on masked tokens."""
    upper, lower = parse_is_threshold(threshold)
    if level == "token":
        log_w = log_ratio
    elif level == "sequence":
        log_w = masked_sum(log_ratio, mask, dim=-1).unsqueeze(-1).expand_as(log_ratio)
    elif level == "geometric":
        log_w = masked_mean(log_ratio, mask, dim=-1).unsqueeze(-1).expand_as(log_ratio)
    else:
        raise ValueError(f"rollout_is={level!r}: choose {', '.join(IS_LEVELS)}")
    raw = torch.exp(log_w.clamp(-SAFETY_BOUND, SAFETY_BOUND)) * mask
    if lower is None:
        weights = raw.clamp(max=upper)
    else:
        weights = torch.where((raw >= lower) & (raw <= upper), raw, torch.zeros_like(raw))
    return raw, weights, upper, lower, log_w


def weight_metrics(raw: torch.Tensor, log_w: torch.Tensor, mask: torch.Tensor, level: str, upper: float,
                   lower: float) -> dict[str, float]:
    """verl's ``compute_is_metrics`` of the weights before truncation (``raw``, (bs, T), 0 on masked
    tokens; ``log_w`` their logs): mean, max and min; the shares above ``upper`` and below ``lower``
    (per token at token level, per sequence at the sequence levels, judged on the log); std and
    effective sample size of the weights held in [lower, upper]; and per-sequence statistics
    (``rollout_is_seq_*``) of each sequence's mean weight. Where verl counts a row with no valid token
    as a sequence of weight 1 (sequence level) or 0 (``seq_*``), rlvr leaves it out, as its seq-mean
    losses do. No valid token at all: every metric 0."""
    valid, seqs = mask.bool(), _seq_valid(mask)
    names = ("mean", "max", "min", "ratio_fraction_high", "ratio_fraction_low", "std", "eff_sample_size",
             "seq_mean", "seq_std", "seq_max", "seq_min", "seq_max_deviation", "seq_fraction_high", "seq_fraction_low")
    if not valid.any():
        return {f"rollout_is_{name}": 0.0 for name in names}
    out = {"mean": masked_mean(raw, mask)}
    if level == "token":
        out.update(max=raw[valid].max(), min=raw[valid].min(),
                   ratio_fraction_high=masked_mean((raw > upper).to(mask.dtype), mask),
                   ratio_fraction_low=masked_mean((raw < lower).to(mask.dtype), mask))
    else:  # one weight per sequence: its log, unclamped but for the max's overflow
        seq_log_w = log_w[:, 0][seqs]  # (valid sequences,)
        out.update(max=torch.exp(seq_log_w.max().clamp(max=SAFETY_BOUND)), min=torch.exp(seq_log_w.min()),
                   ratio_fraction_high=(seq_log_w > math.log(upper)).float().mean(),
                   ratio_fraction_low=(seq_log_w < math.log(lower)).float().mean())
    held = raw.clamp(lower, upper)  # verl's std and ESS: the weights held in the bounds, for stability
    held_mean = masked_mean(held, mask)
    out["std"] = (masked_mean(held.square(), mask) - held_mean.square()).clamp(min=0).sqrt() if mask.sum() > 1 else 0.0
    out["eff_sample_size"] = 1.0 / masked_mean((held / (held_mean + 1e-8)).square(), mask)
    per_seq = masked_mean(raw, mask, dim=-1)[seqs]  # (valid sequences,)
    out.update(seq_mean=per_seq.mean(), seq_std=per_seq.std() if len(per_seq) > 1 else 0.0, seq_max=per_seq.max(),
               seq_min=per_seq.min(), seq_max_deviation=(per_seq - 1.0).abs().max(),
               seq_fraction_high=(per_seq > upper).float().mean(), seq_fraction_low=(per_seq < lower).float().mean())
    return {f"rollout_is_{name}": float(out[name]) for name in names}


def batch_norm_sums(log_ratio: torch.Tensor, mask: torch.Tensor, level: str, threshold) -> tuple[float, float]:
    """(sum, count) of the weights ``rollout_is_batch_normalize`` averages: the tokens' weights
    (``token``), or each sequence's weight (``sequence``, ``geometric``). They add up over
    micro-batches and ranks, so their ratio is the mean over the whole batch however it is split."""
    mask = mask.to(log_ratio.dtype)
    weights = _weights_and_logs(log_ratio.detach(), mask, level, threshold)[1]
    if level == "token":
        return float(masked_sum(weights, mask)), float(mask.sum())
    seqs = _seq_valid(mask)
    return float(masked_mean(weights, mask, dim=-1)[seqs].sum()), float(seqs.sum())


def is_weights(log_ratio: torch.Tensor, mask: torch.Tensor, level: str, threshold,
               batch_normalize: bool = False, norm: float | None = None) -> tuple[torch.Tensor, dict[str, float]]:
    """Importance weights (bs, T), detached and 0 on masked tokens, with their metrics. With
    ``batch_normalize`` they are divided by their mean over ``log_ratio``'s rows, or by ``norm``
    when given (the mean over a larger batch, from ``batch_norm_sums``)."""
    log_ratio = log_ratio.detach()
    mask = mask.to(log_ratio.dtype)
    raw, weights, upper, lower, log_w = _weights_and_logs(log_ratio, mask, level, threshold)
    metrics = weight_metrics(raw, log_w, mask, level, upper, lower if lower is not None else 1.0 / upper)
    if batch_normalize:
        if norm is None:
            total, count = batch_norm_sums(log_ratio, mask, level, threshold)
            norm = total / count if count else 0.0
        metrics["rollout_is_batch_norm_factor"] = norm if norm > 1e-8 else 1.0
        if norm > 1e-8:
            weights = weights / norm
    return weights, metrics


def rejection_mask(log_ratio: torch.Tensor, mask: torch.Tensor, options: str,
                   threshold) -> tuple[torch.Tensor, dict[str, float]]:
    """The loss mask with every token (or sequence) a rejection option refuses set to 0."""
    mask = mask.to(log_ratio.dtype)
    lr = log_ratio.detach().clamp(-SAFETY_BOUND, SAFETY_BOUND)
    per_token = {"k1": -lr, "k2": 0.5 * lr.square(), "k3": torch.exp(lr) - 1.0 - lr}
    valid = mask.bool()
    seqs = _seq_valid(mask)
    keep = torch.ones_like(mask, dtype=torch.bool)
    metrics = {}
    for name, (lower, upper) in parse_rs(options, threshold).items():
        stat = per_token[name[-2:]]
        if name.startswith("seq_sum"):
            stat = masked_sum(stat, mask, dim=-1).unsqueeze(-1)
        elif name.startswith("seq_mean"):
            stat = masked_mean(stat, mask, dim=-1).unsqueeze(-1)
        elif name.startswith("seq_max"):
            stat = stat.masked_fill(~valid, float("-inf")).amax(-1, keepdim=True).clamp(min=0.0)
        if lower is not None:  # k1: a log-ratio interval
            ok = (stat >= math.log(lower)) & (stat <= math.log(upper))
        else:
            ok = stat <= upper
        ok = ok.expand_as(mask)
        keep &= ok
        refused = (~ok) & valid
        metrics[f"rollout_rs_{name}_masked_fraction"] = float(masked_mean(refused.to(mask.dtype), mask))
        metrics[f"rollout_rs_{name}_seq_masked_fraction"] = float(refused.any(-1)[seqs].float().mean()) \
            if seqs.any() else 0.0
    refused = (~keep) & valid
    metrics["rollout_rs_masked_fraction"] = float(masked_mean(refused.to(mask.dtype), mask))
    metrics["rollout_rs_seq_masked_fraction"] = float(refused.any(-1)[seqs].float().mean()) if seqs.any() else 0.0
    return mask * keep.to(mask.dtype), metrics


def gap_metrics(old_log_prob: torch.Tensor, rollout_log_prob: torch.Tensor, mask: torch.Tensor) -> dict[str, float]:
    """How far pi_rollout is from pi_old on the sampled tokens (verl's off-policy diagnostics)."""
    mask = mask.to(old_log_prob.dtype)
    seqs = _seq_valid(mask)
    log_ratio = old_log_prob - rollout_log_prob
    mean_old = masked_mean(old_log_prob, mask, dim=-1)[seqs]
    mean_rollout = masked_mean(rollout_log_prob, mask, dim=-1)[seqs]
    seq_log_ratio = masked_sum(log_ratio, mask, dim=-1)[seqs].clamp(-SAFETY_BOUND, SAFETY_BOUND)
    return {"kl": float(masked_mean(-log_ratio, mask)),
            "k3_kl": float(masked_mean(torch.exp(log_ratio) - 1.0 - log_ratio, mask)),
            "training_ppl": float(torch.exp(-mean_old).mean()),
            "rollout_ppl": float(torch.exp(-mean_rollout).mean()),
            "log_ppl_diff": float((mean_rollout - mean_old).mean()),
            "chi2_token": float(masked_mean(torch.exp(2 * log_ratio.clamp(-SAFETY_BOUND, SAFETY_BOUND)), mask) - 1.0),
            "chi2_seq": float(torch.exp(2 * seq_log_ratio).mean() - 1.0)}


def rollout_correction(old_log_prob: torch.Tensor, rollout_log_prob: torch.Tensor, mask: torch.Tensor,
                       config, is_norm: float | None = None) -> tuple[torch.Tensor | None, torch.Tensor, dict[str, float]]:
    """(IS weights or None, the loss mask after rejection, ``rollout_corr/*`` metrics) for
    ``config`` (``algorithm.rollout_correction``); ``old_log_prob`` is the policy trained.
    ``is_norm``: what ``rollout_is_batch_normalize`` divides by when these rows are part of a
    larger batch (bypass mode's micro-batches); None: their own mean."""
    if old_log_prob.shape != rollout_log_prob.shape or old_log_prob.shape != mask.shape:
        raise ValueError(f"rollout correction needs log-probs and mask of one shape, got {tuple(old_log_prob.shape)}, "
                         f"{tuple(rollout_log_prob.shape)} and {tuple(mask.shape)}")
    log_ratio = (old_log_prob - rollout_log_prob).detach()
    metrics: dict[str, float] = {}
    weights = None
    if config.rollout_is is not None:
        weights, more = is_weights(log_ratio, mask, config.rollout_is, config.rollout_is_threshold,
                                   config.rollout_is_batch_normalize, is_norm)
        metrics.update(more)
    loss_mask = mask
    if config.rollout_rs is not None:
        loss_mask, more = rejection_mask(log_ratio, mask, config.rollout_rs, config.rollout_rs_threshold)
        metrics.update(more)
    if mask.any():
        metrics.update(gap_metrics(old_log_prob.detach(), rollout_log_prob, mask))
    return weights, loss_mask, {f"rollout_corr/{k}": v for k, v in metrics.items()}


def reinforce_loss(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode: str = "token-mean",
                   config=None, rollout_is_weights=None, **agg_kwargs):
    """bypass mode's ``loss_type=reinforce``: -A * w * log pi, w the detached importance weight
    (1 without ``rollout_is``); no clipping. Returns the policy losses' 4-tuple, ppo_kl being
    E[log pi_rollout - log pi]."""
    pg_losses = -advantages * log_prob
    if rollout_is_weights is not None:
        pg_losses = pg_losses * rollout_is_weights
    pg_loss = agg_loss(pg_losses, response_mask, loss_agg_mode, **agg_kwargs)
    zero = torch.zeros((), dtype=pg_loss.dtype, device=pg_loss.device)
    return pg_loss, zero, masked_mean(old_log_prob - log_prob.detach(), response_mask), zero


def is_active(config) -> bool:
    """Whether ``algorithm.rollout_correction`` changes the update (weights, rejection or bypass)."""
    return config.rollout_is is not None or config.rollout_rs is not None or config.bypass_mode
