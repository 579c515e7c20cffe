"""Masked statistics and group bookkeeping shared by the estimators and losses."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch


def masked_sum(values: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Sum of ``values`` where ``mask`` is non-zero (weighted by the mask). Masked-out positions
    are selected away, not multiplied by 0, so a NaN or inf there cannot reach the sum."""
    valid = torch.where(mask.bool(), values, torch.zeros((), dtype=values.dtype, device=values.device)) * mask
    return valid.sum() if dim is None else valid.sum(dim=dim)


def masked_mean(values: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Mean of ``values`` where ``mask`` is 1 (over all elements, or along ``dim``)."""
    count = mask.sum() if dim is None else mask.sum(dim=dim)
    return masked_sum(values, mask, dim) / count.clamp(min=1e-8)


def masked_var(values: torch.Tensor, mask: torch.Tensor, unbiased: bool = True) -> torch.Tensor:
    """Variance over the masked elements; unbiased uses Bessel's correction n / (n - 1)."""
    mean = masked_mean(values, mask)
    var = masked_mean((values - mean) ** 2, mask)
    if unbiased:
        count = mask.sum()
        if count < 2:
            raise ValueError(f"an unbiased variance needs at least 2 masked elements, got {int(count)}")
        var = var * count / (count - 1)
    return var


def masked_whiten(values: torch.Tensor, mask: torch.Tensor, shift_mean: bool = True) -> torch.Tensor:
    """(values - mean) / sqrt(var + 1e-8) over the masked elements; keeps the mean when not shift_mean.
    Values whose squares pass their dtype's range (scores near the reward manager's bound, in float32)
    are whitened in float64, and returned in their dtype: the variance was inf and every value 0."""
    mean, var = masked_mean(values, mask), masked_var(values, mask)
    if values.dtype != torch.float64 and not torch.isfinite(var) and torch.isfinite(mean):
        return masked_whiten(values.double(), mask, shift_mean).to(values.dtype)
    whitened = (values - mean) * torch.rsqrt(var + 1e-8)
    return whitened if shift_mean else whitened + mean


def compute_response_mask(responses: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """The response part of the attention mask: (B, P + R) -> (B, R)."""
    return attention_mask[:, -responses.shape[1]:]


def uid_list(index: Any) -> list:
    """The uids of an index (a numpy object array, a list, an int array or tensor) as Python values."""
    return index.tolist() if hasattr(index, "tolist") else list(index)


def group_ids(index: Any) -> tuple[torch.Tensor, int]:
    """Map each sample's uid to a dense group id 0..G-1, in order of first appearance -> (ids (bs,), G).

    Uids group by value, as the dict verl keys on them does: 1 and "1" are two groups (a cast
    to str would make them one, and give a group of n samples 2n), 1 and 1.0 one."""
    dense: dict = {}
    try:
        ids = [dense.setdefault(uid, len(dense)) for uid in uid_list(index)]
    except TypeError as err:  # a list or dict as a uid
        raise TypeError(f"a uid must be hashable, as verl keys its groups on them: {err}") from err
    return torch.as_tensor(ids, dtype=torch.long), len(dense)


def in_groups(index: Any, groups: Any) -> np.ndarray:
    """(bs,) bool: which samples' uids are among ``groups``, compared by value as ``group_ids`` groups
    (``np.isin`` sorts an object array, which mixed uid types cannot be)."""
    chosen = set(uid_list(groups))
    return np.array([uid in chosen for uid in uid_list(index)], dtype=bool)


def group_range(values: torch.Tensor, ids: torch.Tensor, num_groups: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Each group's (min, max) of ``values``, (G,) each: a group's values are all equal when they meet."""
    lo = torch.zeros(num_groups, dtype=values.dtype).scatter_reduce_(0, ids, values, "amin", include_self=False)
    hi = torch.zeros(num_groups, dtype=values.dtype).scatter_reduce_(0, ids, values, "amax", include_self=False)
    return lo, hi


def group_mean_std(scores: torch.Tensor, ids: torch.Tensor, num_groups: int):
    """Per-sample group mean and unbiased group std, with verl's rule for a group of one
    (mean 0, std 1). Returns (mean (bs,), std (bs,), count (bs,)). Finite scores whose squared
    deviations pass their dtype's range (two of +-1.5e19, inside the reward manager's bound, in
    float32) are taken in float64 and returned in their dtype: the std was inf and every advantage
    of the group 0."""
    count = torch.zeros(num_groups, dtype=scores.dtype).index_add_(0, ids, torch.ones_like(scores))
    total = torch.zeros(num_groups, dtype=scores.dtype).index_add_(0, ids, scores)
    mean = total / count
    sq_dev = torch.zeros(num_groups, dtype=scores.dtype).index_add_(0, ids, (scores - mean[ids]) ** 2)
    if scores.dtype != torch.float64 and not torch.isfinite(sq_dev).all() and torch.isfinite(scores).all():
        return tuple(t.to(scores.dtype) for t in group_mean_std(scores.double(), ids, num_groups))
    std = torch.sqrt(sq_dev / (count - 1).clamp(min=1))
    single = count == 1
    mean = torch.where(single, torch.zeros_like(mean), mean)
    std = torch.where(single, torch.ones_like(std), std)
    return mean[ids], std[ids], count[ids]
