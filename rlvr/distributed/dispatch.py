"""Dispatch modes: how a worker-group call spreads its arguments over the ranks and gathers
the answers (verl's single-controller names).

``@register(dispatch_mode=..., execute_mode=...)`` marks a worker method; a worker group
reads the mark and, for a call, (1) ``dispatch`` turns the arguments into one call per rank,
(2) the ranks run (all, or rank 0 only), (3) ``collect`` turns the answers into one value.

- ``ONE_TO_ALL``: every rank gets the same arguments; the answers come back as a list.
- ``ALL_TO_ALL``: the arguments are already one per rank (lists of world-size length).
- ``RANK_ZERO``: only rank 0 runs; its answer is the answer.
- ``DP_COMPUTE_PROTO``: a DataProto is split by data-parallel rank, keeping each prompt
  group (rows sharing a ``uid``) on one rank, since the prompt-once forward and group
  statistics need the whole group; the answers are concatenated back in rank order.
  Rollouts are padded to the widest rank first (each rank pads its responses to its own
  longest row), so the batch has the layout one process would have given it.
- ``DP_MINI_BATCH_PROTO``: every rank gets the whole DataProto and works on its own share
  of each mini-batch (the update: shuffled mini-batches of whole groups are the same on
  every rank, so a step equals the one-process step); the ranks agree on the answer and
  rank 0's is returned.

``LocalWorkerGroup`` goes through the same functions at world size 1, so the trainer's
calls take one path whatever group it has.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from rlvr.protocol import DataProto, DataProtoError, concat_rollouts

ATTR = "__rlvr_dispatch__"


class Dispatch(enum.Enum):
    ONE_TO_ALL = "one_to_all"
    ALL_TO_ALL = "all_to_all"
    RANK_ZERO = "rank_zero"
    DP_COMPUTE_PROTO = "dp_compute_proto"
    DP_MINI_BATCH_PROTO = "dp_mini_batch_proto"


class Execute(enum.Enum):
    ALL = "all"
    RANK_ZERO = "rank_zero"


@dataclass(frozen=True)
class Registration:
    dispatch_mode: Dispatch
    execute_mode: Execute


def register(dispatch_mode: Dispatch = Dispatch.ALL_TO_ALL, execute_mode: Execute = Execute.ALL):
    """Mark a worker method with how a worker group calls it (the method itself is unchanged)."""
    def decorate(fn: Callable) -> Callable:
        setattr(fn, ATTR, Registration(Dispatch(dispatch_mode), Execute(execute_mode)))
        return fn
    return decorate


def registration(method: Callable) -> Registration:
    """A method's mark; an unmarked method is called on every rank with the same arguments."""
    return getattr(method, ATTR, Registration(Dispatch.ONE_TO_ALL, Execute.ALL))


class DispatchError(ValueError):
    """Arguments that cannot be spread over the ranks as the method's mode asks."""


def split_by_groups(data: DataProto, world_size: int) -> list[DataProto]:
    """``world_size`` parts of as many whole ``uid`` groups each (contiguous rows; one part per
    rank). Groups have n rows each, except where an agent's episode was split into several samples
    (``protocol.episode_rows``): the parts then hold as many groups, not as many rows."""
    if world_size == 1:
        return [data]
    uids = data.non_tensor_batch.get("uid")
    runs = _runs(uids) if uids is not None else [[i] for i in range(len(data))]
    if uids is not None and len(set(uids)) != len(runs):
        raise DispatchError("rows of a uid group must be contiguous (repeat with interleave=True) to be split by rank")
    if len(runs) % world_size:
        raise DispatchError(f"{len(data)} rows in {len(runs)} groups cannot be split evenly over {world_size} ranks; "
                            f"make the number of prompts per step a multiple of {world_size}")
    per = len(runs) // world_size
    return [data.slice(runs[r * per][0], runs[(r + 1) * per - 1][-1] + 1) for r in range(world_size)]


def pad_groups(data: DataProto, world_size: int) -> tuple[DataProto, int]:
    """``data`` with copies of its last rows appended so its groups split evenly over the ranks
    (validation batches: a remainder of prompts), and the number of rows added. Training batches
    never need it: their sizes are checked at config load."""
    uids = data.non_tensor_batch.get("uid")
    sizes = [len(g) for g in _runs(uids)] if uids is not None else [1] * len(data)
    missing = -len(sizes) % world_size
    if not missing or not len(data):
        return data, 0
    if len(set(sizes)) != 1:
        raise DispatchError(f"{len(sizes)} groups of unequal sizes cannot be padded to a multiple of {world_size}")
    rows = missing * sizes[0]
    extra = DataProto.concat([data.slice(len(data) - sizes[0], len(data))] * missing)
    if uids is not None:
        extra.non_tensor_batch["uid"] = np.array([f"{u}#pad{i // sizes[0]}" for i, u in
                                                  enumerate(extra.non_tensor_batch["uid"])], dtype=object)
    return DataProto.concat([data, extra]), rows


def _runs(uids) -> list[list[int]]:
    """Row indices of each run of equal consecutive uids."""
    runs: list[list[int]] = []
    for i, uid in enumerate(uids):
        if i and uid == uids[i - 1]:
            runs[-1].append(i)
        else:
            runs.append([i])
    return runs


def dispatch(mode: Dispatch, world_size: int, args: tuple, kwargs: dict) -> list[tuple[tuple, dict]]:
    """One (args, kwargs) per rank."""
    if mode in (Dispatch.ONE_TO_ALL, Dispatch.RANK_ZERO, Dispatch.DP_MINI_BATCH_PROTO):
        return [(args, kwargs)] * world_size
    if mode is Dispatch.ALL_TO_ALL:
        for value in (*args, *kwargs.values()):
            if not isinstance(value, (list, tuple)) or len(value) != world_size:
                raise DispatchError(f"ALL_TO_ALL needs one value per rank ({world_size}); got {type(value).__name__}")
        return [(tuple(a[r] for a in args), {k: v[r] for k, v in kwargs.items()}) for r in range(world_size)]
    split_args = [split_by_groups(a, world_size) if isinstance(a, DataProto) else [a] * world_size for a in args]
    split_kwargs = {k: split_by_groups(v, world_size) if isinstance(v, DataProto) else [v] * world_size
                    for k, v in kwargs.items()}
    return [(tuple(a[r] for a in split_args), {k: v[r] for k, v in split_kwargs.items()}) for r in range(world_size)]


def collect(mode: Dispatch, outputs: list[Any], pad_rows: int = 0) -> Any:
    """The group's answer from the ranks' answers (in rank order), less ``pad_rows`` padding rows."""
    if mode in (Dispatch.RANK_ZERO, Dispatch.DP_MINI_BATCH_PROTO):
        return outputs[0]
    if mode is Dispatch.DP_COMPUTE_PROTO:
        if all(isinstance(o, DataProto) for o in outputs):
            out = outputs[0] if len(outputs) == 1 else concat_ranks(outputs)
            return out.slice(0, len(out) - pad_rows) if pad_rows else out
        return outputs[0] if len(outputs) == 1 else outputs
    return outputs


# rollout_metrics that count things (AgentLoopRollout's counters): the batch's is the ranks' sum
SUMMED_ROLLOUT_METRICS = ("agent/calls", "agent/truncated", "agent/split_samples", "agent/context_breaks")


def concat_ranks(outputs: list[DataProto]) -> DataProto:
    """The ranks' DataProtos as one, in rank order. Rollouts (``responses`` beside ``input_ids``)
    may differ in width, since each rank pads to its own longest row: they are padded to the
    widest rank (``concat_rollouts``) as one process would have padded the whole batch. Each
    rank's ``meta_info["rollout_metrics"]`` (taken off its answer) is joined by
    ``join_rollout_metrics``. Any other difference is refused naming the rank that differs from
    rank 0."""
    first = outputs[0]
    for rank, out in enumerate(outputs[1:], start=1):
        if sorted(out.keys()) != sorted(first.keys()):
            raise DataProtoError(f"rank {rank} answered keys {sorted(out.keys())}, rank 0 {sorted(first.keys())}")
    metrics = join_rollout_metrics([(len(out), out.meta_info.pop("rollout_metrics", None)) for out in outputs])
    if "responses" in first.batch and "input_ids" in first.batch:
        joined = concat_rollouts(outputs)
    else:
        for key, value in first.batch.items():
            for rank, out in enumerate(outputs[1:], start=1):
                if out.batch[key].shape[1:] != value.shape[1:]:
                    raise DataProtoError(f"rank {rank} answered {key!r} of shape {tuple(out.batch[key].shape)}, "
                                         f"rank 0 of {tuple(value.shape)}")
        joined = DataProto.concat(outputs)
    if metrics is not None:
        joined.meta_info["rollout_metrics"] = metrics
    return joined


def join_rollout_metrics(ranks: list[tuple[int, dict | None]]) -> dict[str, float] | None:
    """The batch's rollout metrics from each rank's (rows, metrics): the counts in
    ``SUMMED_ROLLOUT_METRICS`` summed, any other value (a loop's mean per episode, a gauge) averaged
    over the ranks that report it, weighted by their episodes (rows less ``agent/split_samples``),
    as one process's mean over the whole batch would be. None when no rank reports any."""
    reported = [(rows, m) for rows, m in ranks if m is not None]
    if not reported:
        return None
    joined: dict[str, float] = {}
    for name in dict.fromkeys(k for _, m in reported for k in m):
        having = [(rows - float(m.get("agent/split_samples", 0.0)), m[name]) for rows, m in reported if name in m]
        if name in SUMMED_ROLLOUT_METRICS:
            joined[name] = float(sum(value for _, value in having))
        else:
            episodes = sum(w for w, _ in having)
            joined[name] = float(sum(w * value for w, value in having) / episodes if episodes > 0 else
                                 sum(value for _, value in having) / len(having))
    return joined
