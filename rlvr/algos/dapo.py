"""DAPO's data-side tools as pure functions (Yu et al., 2025).

- Dynamic sampling: drop groups whose chosen metric has zero spread (all right or all
  wrong): they carry no GRPO signal. Filter on accuracy by default, not the shaped reward,
  which the length penalty makes vary even when every answer is equally right.
- Overlong reward shaping: a linear penalty for responses that run into the last
  ``overlong_buffer_len`` tokens before ``max_response_length``.
"""

from __future__ import annotations

from typing import Any

import torch

from rlvr.algos.utils import group_ids, group_range


def filter_groups(index: Any, metric: torch.Tensor) -> torch.Tensor:
    """Boolean keep-mask (bs,): samples of groups whose metric has non-zero std, or of size one."""
    ids, num_groups = group_ids(index)
    metric = metric.to(torch.float64)
    count = torch.zeros(num_groups, dtype=metric.dtype).index_add_(0, ids, torch.ones_like(metric))
    lo, hi = group_range(metric, ids, num_groups)
    keep_group = (hi > lo) | (count == 1)  # std > 0 exactly when max > min
    return keep_group[ids]


def overlong_penalty(response_lengths: torch.Tensor, max_response_length: int, overlong_buffer_len: int,
                     penalty_factor: float = 1.0) -> torch.Tensor:
    """min(0, -(len - (max - buffer)) / buffer * factor) per sample: 0 before the buffer,
    falling linearly to -factor at max_response_length."""
    if overlong_buffer_len <= 0 or overlong_buffer_len > max_response_length:
        raise ValueError(
            f"overlong_buffer_len must be in 1..max_response_length={max_response_length}, got {overlong_buffer_len}"
        )
    expected = max_response_length - overlong_buffer_len
    exceed = response_lengths.to(torch.float32) - expected
    return torch.clamp(-exceed / overlong_buffer_len * penalty_factor, max=0.0)
