"""Advantage estimators behind one registry and one signature.

Every estimator is called as::

    fn(token_level_rewards, response_mask, index, config=None, values=None,
       reward_baselines=None, gamma=None, lam=None, **estimator_options)
       -> (advantages, returns)        # both (bs, T), zero outside response_mask

``index`` is the uid array (numpy object, one uid per prompt, shared by its n samples);
uids group by value, as verl's dict of them does (1 and "1" are two groups: ``group_ids``).
``config`` is the ``algorithm`` sub-config, consulted only for a value not passed
explicitly. Values match verl's core_algos on the same tensors; grouped estimators are
vectorised with scatter-adds over dense group ids (one dict lookup per uid makes them; no
Python loop over samples or groups in the arithmetic).

Departures from verl: none in the values inside the mask. GAE's advantages are zero outside
it, where verl's whitening leaves values (no loss reads them). ``grpo_passk`` breaks ties for
the best sample by the lowest row index (verl leaves it to ``torch.topk``). ``grpo_vectorized``
reads ``norm_adv_by_std_in_grpo`` as ``grpo`` does (verl's trainer passed it to ``grpo`` alone:
verl #7893). The trainer passes the loss mask as ``response_mask`` (tokens rollout correction
rejected are out, as verl narrows ``response_mask`` before ``compute_advantage``).
"""

from __future__ import annotations

import inspect
from typing import Any, Callable

import torch

from rlvr.registry import Registry
from rlvr.algos.utils import group_ids, group_mean_std, masked_whiten
from rlvr.protocol import EPISODE_SAMPLE, DataProto, episode_rows, final_samples

AdvantageFn = Callable[..., tuple[torch.Tensor, torch.Tensor]]
ADV_ESTIMATORS: Registry[AdvantageFn] = Registry("advantage estimator")
register_adv_est = ADV_ESTIMATORS.register


def get_adv_estimator_fn(name: str) -> AdvantageFn:
    return ADV_ESTIMATORS.get(name)


def _option(explicit: Any, config: Any, name: str, default: Any) -> Any:
    """An estimator option: the explicit argument, else the config's field, else the default."""
    if explicit is not None:
        return explicit
    return getattr(config, name, default) if config is not None else default


@register_adv_est("grpo")
def compute_grpo_outcome_advantage(token_level_rewards, response_mask, index, config=None, epsilon=1e-6,
                                   norm_adv_by_std_in_grpo=None, **unused):
    """GRPO: (score - group mean) / (group std + eps); Dr.GRPO without the std division."""
    norm = _option(norm_adv_by_std_in_grpo, config, "norm_adv_by_std_in_grpo", True)
    return _grpo(token_level_rewards, response_mask, index, epsilon, norm, std_floor=0.0)


def _grpo(token_level_rewards, response_mask, index, epsilon: float, norm: bool, std_floor: float):
    """(score - group mean) / (max(group std, std_floor) + eps), or score - group mean."""
    scores = token_level_rewards.sum(dim=-1)  # (bs,)
    ids, num_groups = group_ids(index)
    mean, std, _ = group_mean_std(scores, ids, num_groups)
    adv = (scores - mean) / (std.clamp(min=std_floor) + epsilon) if norm else scores - mean
    adv = adv.unsqueeze(-1) * response_mask  # (bs, T)
    return adv, adv


@register_adv_est("grpo_vectorized")
def compute_grpo_vectorized_outcome_advantage(token_level_rewards, response_mask, index, config=None, epsilon=1e-6,
                                              norm_adv_by_std_in_grpo=None, **unused):
    """verl's vectorised GRPO: GRPO with the group variance floored at ``epsilon`` (std >= 1e-3)."""
    norm = _option(norm_adv_by_std_in_grpo, config, "norm_adv_by_std_in_grpo", True)
    return _grpo(token_level_rewards, response_mask, index, epsilon, norm, std_floor=epsilon ** 0.5)  # sqrt(max(var, eps))


@register_adv_est("grpo_passk")
def compute_grpo_passk_outcome_advantage(token_level_rewards, response_mask, index, config=None, epsilon=1e-6,
                                         norm_adv_by_std_in_grpo=None, **unused):
    """Pass@k GRPO: only each group's best sample gets (best - second best) [/ group std]."""
    norm = _option(norm_adv_by_std_in_grpo, config, "norm_adv_by_std_in_grpo", True)
    scores = token_level_rewards.sum(dim=-1)  # (bs,)
    ids, num_groups = group_ids(index)
    _, std, count = group_mean_std(scores, ids, num_groups)
    if bool((count < 2).any()):
        raise ValueError("grpo_passk needs at least 2 samples per group (set actor_rollout_ref.rollout.n >= 2)")
    # Sort by (group, score desc, row asc) with two stable sorts: each group's first row is its best.
    by_score = torch.sort(-scores, stable=True).indices
    order = by_score[torch.sort(ids[by_score], stable=True).indices]
    first = torch.ones(len(order), dtype=torch.bool)
    first[1:] = ids[order][1:] != ids[order][:-1]
    best_rows = order[first]
    second_rows = order[torch.nonzero(first).squeeze(-1) + 1]
    gap = scores[best_rows] - scores[second_rows]
    if norm:
        gap = gap / (std[best_rows] + epsilon)
    adv = torch.zeros_like(scores).index_put_((best_rows,), gap)
    adv = adv.unsqueeze(-1) * response_mask
    return adv, adv


@register_adv_est("rloo")
def compute_rloo_outcome_advantage(token_level_rewards, response_mask, index, config=None, **unused):
    """RLOO: score minus the mean of the other samples of its group (groups of one keep the score)."""
    return _rloo(token_level_rewards, response_mask, index, alone_keeps_score=True)


def _rloo(token_level_rewards, response_mask, index, alone_keeps_score: bool):
    """The leave-one-out advantage; a group of one gets its score or 0."""
    scores = token_level_rewards.sum(dim=-1)
    ids, num_groups = group_ids(index)
    mean, _, count = group_mean_std(scores, ids, num_groups)
    # s * n/(n-1) - mean * n/(n-1) = s - (sum - s)/(n-1): the leave-one-out baseline
    loo = (scores - mean) * count / (count - 1).clamp(min=1)
    alone = scores if alone_keeps_score else torch.zeros_like(loo)
    adv = torch.where(count > 1, loo, alone).unsqueeze(-1) * response_mask
    return adv, adv


@register_adv_est("rloo_vectorized")
def compute_rloo_vectorized_outcome_advantage(token_level_rewards, response_mask, index, config=None, **unused):
    """verl's vectorised RLOO: the leave-one-out advantage, 0 for a group of one (``rloo`` keeps its score)."""
    return _rloo(token_level_rewards, response_mask, index, alone_keeps_score=False)


@register_adv_est("gpg")
def compute_gpg_outcome_advantage(token_level_rewards, response_mask, index, config=None, f_norm=1.0, **unused):
    """GPG (AMAP-ML/GPG): alpha * (score - group mean) / f_norm, alpha = batch size / non-zero scores
    (the batch's share of samples with a reward, inverted); a group of one has mean 0, as in GRPO."""
    scores = token_level_rewards.sum(dim=-1)
    alpha = scores.numel() / torch.count_nonzero(scores).clamp(min=1)
    ids, num_groups = group_ids(index)
    mean, _, _ = group_mean_std(scores, ids, num_groups)
    adv = (alpha * (scores - mean) / f_norm).unsqueeze(-1) * response_mask
    return adv, adv


@register_adv_est("opo")
def compute_opo_outcome_advantage(token_level_rewards, response_mask, index, config=None, **unused):
    """OPO: score minus the length-weighted group mean sum(len * score) / sum(len)."""
    scores = token_level_rewards.sum(dim=-1)
    lengths = response_mask.sum(dim=-1).to(scores.dtype)
    ids, num_groups = group_ids(index)
    weighted = torch.zeros(num_groups, dtype=scores.dtype).index_add_(0, ids, lengths * scores)
    total_len = torch.zeros(num_groups, dtype=scores.dtype).index_add_(0, ids, lengths)
    count = torch.zeros(num_groups, dtype=scores.dtype).index_add_(0, ids, torch.ones_like(scores))
    baseline = torch.where(count > 1, weighted / total_len.clamp(min=1e-8), torch.zeros_like(weighted))[ids]
    adv = (scores - baseline).unsqueeze(-1) * response_mask
    return adv, adv


def discounted_returns(token_level_rewards, response_mask, gamma: float) -> torch.Tensor:
    """G_t = r_t + gamma * G_{t+1}, reset after the last valid token.  (bs, T)"""
    returns = torch.zeros_like(token_level_rewards)
    running = torch.zeros_like(token_level_rewards[:, 0])
    for t in reversed(range(token_level_rewards.shape[1])):  # a recursion in time, vectorised over samples
        running = token_level_rewards[:, t] + gamma * running
        returns[:, t] = running
        running = running * response_mask[:, t]
    return returns


@register_adv_est("reinforce_plus_plus")
def compute_reinforce_plus_plus_outcome_advantage(token_level_rewards, response_mask, index=None, config=None,
                                                  gamma=None, **unused):
    """REINFORCE++: discounted returns, whitened over the batch."""
    gamma = _option(gamma, config, "gamma", 1.0)
    returns = discounted_returns(token_level_rewards, response_mask, gamma)
    adv = masked_whiten(returns, response_mask) * response_mask
    return adv, returns


@register_adv_est("reinforce_plus_plus_baseline")
def compute_reinforce_plus_plus_baseline_outcome_advantage(token_level_rewards, response_mask, index, config=None,
                                                           **unused):
    """REINFORCE++ with baseline: score minus group mean, then whitened over the batch."""
    scores = token_level_rewards.sum(dim=-1)
    ids, num_groups = group_ids(index)
    mean, _, _ = group_mean_std(scores, ids, num_groups)
    adv = (scores - mean).unsqueeze(-1) * response_mask
    adv = masked_whiten(adv, response_mask) * response_mask
    return adv, adv


@register_adv_est("remax")
def compute_remax_outcome_advantage(token_level_rewards, response_mask, index=None, config=None,
                                    reward_baselines=None, **unused):
    """ReMax: returns-to-go minus the greedy response's reward (``reward_baselines``)."""
    if reward_baselines is None:
        raise ValueError("remax needs reward_baselines: the reward of each prompt's greedy response")
    returns = (token_level_rewards * response_mask).flip(-1).cumsum(-1).flip(-1)
    adv = returns - reward_baselines.unsqueeze(-1) * response_mask
    return adv, returns


@register_adv_est("gae")
def compute_gae_advantage_return(token_level_rewards, response_mask, index=None, config=None, values=None,
                                 gamma=None, lam=None, **unused):
    """GAE (PPO with a critic): TD(lambda) advantages, whitened; returns = advantages + values."""
    if values is None:
        raise ValueError("gae needs the critic's values (algorithm.adv_estimator=gae requires a critic)")
    gamma, lam = _option(gamma, config, "gamma", 1.0), _option(lam, config, "lam", 1.0)
    next_value = torch.zeros_like(values[:, 0])
    last_gae = torch.zeros_like(values[:, 0])
    reversed_adv = []
    for t in reversed(range(token_level_rewards.shape[1])):
        delta = token_level_rewards[:, t] + gamma * next_value - values[:, t]
        gae = delta + gamma * lam * last_gae
        m = response_mask[:, t]
        # masked positions (padding, tool output) pass value and advantage through unchanged
        next_value = values[:, t] * m + (1 - m) * next_value
        last_gae = gae * m + (1 - m) * last_gae
        reversed_adv.append(last_gae)
    advantages = torch.stack(reversed_adv[::-1], dim=1)
    returns = advantages + values
    advantages = masked_whiten(advantages, response_mask) * response_mask
    return advantages, returns


def compute_advantage(data: DataProto, config) -> DataProto:
    """Run ``config.adv_estimator`` on a batch; adds ``advantages`` and ``returns`` (in place).
    An episode split into several samples (``episode_rows``) counts once: see ``_split_episodes``."""
    data.require("token_level_rewards", "response_mask", stage=f"advantage estimator {config.adv_estimator!r}")
    if episode_rows(data) is not None:
        return _split_episodes(data, config)
    fn = get_adv_estimator_fn(config.adv_estimator)
    inputs = {"token_level_rewards": data.batch["token_level_rewards"], "response_mask": data.batch["response_mask"],
              "index": data.non_tensor_batch.get("uid"), "config": config, "values": data.batch.get("values"),
              "reward_baselines": data.batch.get("reward_baselines")}
    params = inspect.signature(fn).parameters
    if not any(p.kind is p.VAR_KEYWORD for p in params.values()):  # a user's estimator with verl's narrower signature
        inputs = {k: v for k, v in inputs.items() if k in params}
    advantages, returns = fn(**inputs)
    data.batch["advantages"], data.batch["returns"] = advantages, returns
    return data


def _split_episodes(data: DataProto, config) -> DataProto:
    """Advantages of a batch where some episodes are several samples (an agent that rewrote its
    context): the estimator sees one row per episode, its last sample (whose score is the
    episode's), so a group's baseline is over its n episodes whatever their sample counts; every
    sample of an episode then gets that row's advantage on each of its own tokens. That needs an
    estimator whose advantage is one number per sequence (GRPO, RLOO, ReMax, ...): one that varies
    along the tokens (GAE, a discounted return) is refused, naming it."""
    rows, final = episode_rows(data), final_samples(data)
    last = data.select_idxs(final)
    last.non_tensor_batch.pop(EPISODE_SAMPLE)
    compute_advantage(last, config)
    mask = last.batch["response_mask"].bool()
    per_episode = {}
    for key in ("advantages", "returns"):
        values = last.batch[key]
        first = torch.where(mask.any(-1), mask.float().argmax(-1), 0)
        scalar = values.gather(1, first[:, None]).squeeze(1)  # (episodes,)
        spread = torch.where(mask, (values - scalar[:, None]).abs(), 0.0).amax(-1)
        if key == "advantages" and bool((spread > 1e-5 * (1 + scalar.abs())).any()):
            raise ValueError(f"algorithm.adv_estimator={config.adv_estimator!r} gives advantages that vary along a "
                             "response, which the samples of a split episode (an agent that rewrote its context) "
                             "cannot share: use an estimator with one advantage per sequence (grpo, rloo, remax, "
                             "reinforce_plus_plus_baseline), or an agent whose calls extend each other")
        per_episode[key] = scalar
    response_mask = data.batch["response_mask"]
    index = torch.as_tensor(rows, device=response_mask.device)
    for key, scalar in per_episode.items():
        data.batch[key] = scalar.to(response_mask.device)[index][:, None] * response_mask.to(scalar.dtype)
    return data
