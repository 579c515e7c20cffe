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

``LocalWorkerGroup`` goes through the same functions at world size 1, so the trainer's
calls take one path whatever group it has.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any, Callable

from rlvr.protocol import DataProto

ATTR = "__rlvr_dispatch__"


class Dispatch(enum.Enum):
    ONE_TO_ALL = "one_to_all"
    ALL_TO_ALL = "all_to_all"
    RANK_ZERO = "rank_zero"
    DP_COMPUTE_PROTO = "dp_compute_proto"


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
    """``world_size`` equal parts of whole ``uid`` groups (contiguous rows; one part per rank)."""
    if world_size == 1:
        return [data]
    uids = data.non_tensor_batch.get("uid")
    starts = [0] if uids is None else [i for i in range(len(data)) if i == 0 or uids[i] != uids[i - 1]]
    units = len(starts) if uids is not None else len(data)
    if uids is not None and len(set(uids)) != units:
        raise DispatchError("rows of a uid group must be contiguous (repeat with interleave=True) to be split by rank")
    if units % world_size or len(data) % world_size:
        raise DispatchError(f"{len(data)} rows in {units} groups cannot be split evenly over {world_size} ranks; "
                            f"make the number of prompts per step a multiple of {world_size}")
    per = len(data) // world_size
    parts = [data.slice(r * per, (r + 1) * per) for r in range(world_size)]
    if uids is not None and any(parts[r].non_tensor_batch["uid"][0] == parts[r - 1].non_tensor_batch["uid"][-1]
                                for r in range(1, world_size)):
        raise DispatchError(f"groups of unequal size cannot be split into {world_size} equal parts of whole groups")
    return parts


def dispatch(mode: Dispatch, world_size: int, args: tuple, kwargs: dict) -> list[tuple[tuple, dict]]:
    """One (args, kwargs) per rank."""
    if mode in (Dispatch.ONE_TO_ALL, Dispatch.RANK_ZERO):
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


def collect(mode: Dispatch, outputs: list[Any]) -> Any:
    """The group's answer from the ranks' answers (in rank order)."""
    if mode is Dispatch.RANK_ZERO:
        return outputs[0]
    if mode is Dispatch.DP_COMPUTE_PROTO:
        if all(isinstance(o, DataProto) for o in outputs):
            return outputs[0] if len(outputs) == 1 else DataProto.concat(outputs)
        return outputs[0] if len(outputs) == 1 else outputs
    return outputs
