"""On-policy distillation losses: the student samples, a frozen teacher scores every sampled
token, and the student moves toward the teacher token by token (verl's OPD, ``distillation.*``).

Every loss mode sits in one registry and has one signature::

    fn(student_log_prob, teacher_log_prob, config) -> (bs, T) per-token loss

where the inputs are the sampled tokens' log-probs, (bs, T) each, for the estimator modes
(``use_topk`` False), and the log-probs at the teacher's top-k tokens, (bs, T, k) each, for the
top-k modes. ``config`` is ``distillation.distillation_loss``.

- ``kl`` / ``k1``: s - t, a single-sample estimate of the reverse KL(student || teacher);
  its gradient does not depend on the teacher, so it is refused without ``use_policy_gradient``.
- ``abs``: |s - t|; ``mse`` / ``k2``: (s - t)^2 / 2; ``low_var_kl`` / ``k3``: Schulman's
  exp(t - s) - (t - s) - 1, clamped as the KL loss's (``rlvr.algos.kl``).
- ``forward_kl_topk``: sum over the teacher's top-k tokens v of p_t(v) (log p_t(v) - log p_s(v)),
  neither side renormalised, floored at 0 (the truncated sum can dip below it); with
  ``log_prob_min_clamp`` both sides' log-probs are clamped from below first.

``distillation_loss`` turns the per-token loss into the term the actor adds: clamped to
``loss_max_clamp``, then either aggregated like any loss term (``agg_loss``: the mini-batch's
totals, so micro-batch and rank splits do not change it), or (``use_policy_gradient``) its
negation is a per-token advantage in the vanilla PPO clipped loss with the distillation's own
clip ratios: verl's PG OPD, where k1 makes each token's reward log p_t - log p_s.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import torch

from rlvr.algos.kl import kl_penalty
from rlvr.algos.losses import agg_loss, call_policy_loss, get_policy_loss_fn
from rlvr.registry import Registry


DistillationLossFn = Callable[[torch.Tensor, torch.Tensor, object], torch.Tensor]
DISTILLATION_LOSSES: Registry[DistillationLossFn] = Registry("distillation loss_mode")


def register_distillation_loss(*names: str, use_topk: bool = False):
    """``@register_distillation_loss("k3", "low_var_kl")``: the function under each name;
    ``use_topk`` says it takes the log-probs at the teacher's top-k tokens (its ``use_topk``)."""
    def decorator(fn):
        fn.use_topk = use_topk
        for name in names:
            DISTILLATION_LOSSES.register(name)(fn)
        return fn
    return decorator


def get_distillation_loss(name: str) -> DistillationLossFn:
    return DISTILLATION_LOSSES.get(name)


def _estimator(mode: str):
    def loss(student_log_prob: torch.Tensor, teacher_log_prob: torch.Tensor, config) -> torch.Tensor:
        return kl_penalty(student_log_prob, teacher_log_prob, mode)  # x = s - t, as the KL loss's logp - ref_logp
    loss.__name__ = loss.__qualname__ = f"reverse_kl_{mode}"
    return loss


for _names in (("kl", "k1"), ("abs",), ("mse", "k2"), ("low_var_kl", "k3")):
    register_distillation_loss(*_names)(_estimator(_names[0]))


@register_distillation_loss("forward_kl_topk", use_topk=True)
def forward_kl_topk(student_log_prob: torch.Tensor, teacher_log_prob: torch.Tensor, config) -> torch.Tensor:
    """(bs, T, k) log-probs at the teacher's top-k tokens -> (bs, T) forward KL over them."""
    floor = getattr(config, "log_prob_min_clamp", None)
    s, t = student_log_prob.float(), teacher_log_prob.float()
    if floor is not None:
        s, t = s.clamp_min(floor), t.clamp_min(floor)
    return (t.exp() * (t - s)).sum(dim=-1).clamp_min(0.0)


def distillation_loss(student: torch.Tensor, teacher: torch.Tensor, log_prob: torch.Tensor,
                      old_log_prob: torch.Tensor, mask: torch.Tensor, config, actor_config,
                      **totals) -> tuple[torch.Tensor, dict[str, float]]:
    """The actor's distillation term of one micro-batch and its metrics (verl's names, under
    ``actor/``). ``student``/``teacher``: what the mode takes (see the module docstring);
    ``log_prob``/``old_log_prob``: the sampled tokens' (bs, T), for the PPO ratio of
    ``use_policy_gradient``; ``totals``: the mini-batch's, as for every loss term."""
    losses = get_distillation_loss(config.loss_mode)(student, teacher, config)  # (bs, T)
    if config.loss_max_clamp is not None:  # both sides: k1 is negative where the student is less sure
        losses = losses.clamp(-config.loss_max_clamp, config.loss_max_clamp)
    n = mask.sum().clamp(min=1)
    metrics = {"actor/distillation/abs_loss": float((losses.detach().abs() * mask).sum() / n)}
    if config.use_policy_gradient:
        pg_config = dataclasses.replace(actor_config, clip_ratio=config.clip_ratio, clip_ratio_low=config.clip_ratio_low,
                                        clip_ratio_high=config.clip_ratio_high)
        loss, clipfrac, ppo_kl, clipfrac_lower = call_policy_loss(
            get_policy_loss_fn(config.policy_loss_mode), old_log_prob, log_prob, -losses.detach(), mask,
            actor_config.loss_agg_mode, pg_config, **totals)
        metrics.update({f"actor/distillation/{name}": float(torch.as_tensor(value).detach()) for name, value in
                        (("pg_clipfrac", clipfrac), ("ppo_kl", ppo_kl), ("pg_clipfrac_lower", clipfrac_lower))})
    else:
        loss = agg_loss(losses, mask, actor_config.loss_agg_mode, **totals)
    metrics["actor/distillation/loss"] = float(loss.detach())
    return loss, metrics


def topk_masses(student: torch.Tensor, teacher: torch.Tensor, mask: torch.Tensor) -> dict[str, float]:
    """Mean probability mass the student and the teacher put on the teacher's top-k tokens
    (verl's ``student_mass`` / ``teacher_mass``): near 1 each when k covers the distributions."""
    n = mask.sum().clamp(min=1)
    return {"actor/distillation/student_mass": float((student.detach().exp().sum(-1) * mask).sum() / n),
            "actor/distillation/teacher_mass": float((teacher.exp().sum(-1) * mask).sum() / n)}
