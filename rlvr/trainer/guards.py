"""Checks every training run makes, each stopping the run with what it found rather than training
on silently (the public bugs each answers: docs/silent.md): groups whole before their
advantages, masks nested, and the freshness probe's tolerance."""

from __future__ import annotations

import numpy as np

from rlvr.config.schema import RLVRConfig
from rlvr.errors import StopTraining
from rlvr.protocol import DataProto, loss_mask

PROBE_TOKENS = 16  # the freshness probe: greedy tokens per prompt compared with the actor's
GAP_TEMPERATURE = 1e-4  # -T log softmax(z / T)[token] is max(z) - z[token], to within T ln V (0.0011 at V = 50k)


def freshness_tolerance(config: RLVRConfig) -> float:
    """How far (in logits) the engine's greedy token may trail the actor's own greedy token and
    still be two precisions disagreeing on a near-tie rather than stale weights: 0.01 when actor
    and engine both compute in fp32, 0.25 when either computes in 16 bits."""
    arr = config.actor_rollout_ref
    dtypes = (arr.actor.dtype, arr.rollout.dtype, arr.actor.fsdp_config.mixed_precision.param_dtype)
    return 0.01 if all(d in ("float32", "auto") for d in dtypes) else 0.25


def check_groups(uids: np.ndarray, n: int, step: int) -> None:
    """Every group reaches the advantage estimator whole: ``n`` rows per prompt (AReaL #1419: a
    group that lost rows to a filter or a collection across ranks is normalised over the wrong
    mean and std, silently). Rows left out of the update stay in the batch (``train_mask``), so
    a group short of rows, or with more, is a bug upstream: stopped here, named."""
    groups, counts = np.unique(uids, return_counts=True)
    wrong = counts != n
    if wrong.any():
        named = ", ".join(f"{g!r}: {c} rows" for g, c in zip(groups[wrong][:3], counts[wrong][:3]))
        raise StopTraining(f"step {step}: {int(wrong.sum())} of {len(groups)} groups do not have "
                           f"actor_rollout_ref.rollout.n = {n} rows before their advantages ({named}); a group "
                           "normalised over fewer or more samples than it has gets a wrong baseline")


def check_masks(batch: DataProto, step: int) -> None:
    """Loss only where a token was sampled, and a token only where it is present: the loss mask
    (``train_mask``, else ``response_mask``) within ``response_mask`` (tool output and padding are
    0 there), within the attention mask's response part (truncation included). A token outside
    would train on padding or on text the model did not write, silently."""
    response, loss = batch.batch["response_mask"].bool(), loss_mask(batch).bool()
    present = batch.batch["attention_mask"][:, -response.shape[1]:].bool()
    for inner, outer, what in ((loss, response, "the loss mask is outside response_mask"),
                               (response, present, "response_mask marks tokens the attention mask does not hold")):
        outside = inner & ~outer
        if outside.any():
            row, col = (int(i) for i in outside.nonzero()[0])
            raise StopTraining(f"step {step}: {what} at {int(outside.sum())} token(s), first at row {row}, response "
                               f"token {col}; the update would train on tokens the model did not sample")
