"""``LocalWorkerGroup``: the worker methods of one in-process worker.

The trainer calls ``worker_group.generate_sequences(batch)`` and friends and never knows
where the worker lives. Here it is the same process and device (one CPU or one GPU); a Ray
worker group offers the same methods, splitting each DataProto by data-parallel rank and
concatenating the answers, so it can replace this class without touching the trainer.
"""

from __future__ import annotations

import functools
from typing import Any

from rlvr.distributed.dispatch import Dispatch, collect, dispatch, registration
from rlvr.protocol import DataProto

WORKER_METHODS = ("init_model", "generate_sequences", "compute_log_prob", "compute_ref_log_prob",
                  "compute_teacher_log_prob", "update_actor",
                  "compute_values", "update_critic", "save_checkpoint", "load_checkpoint", "full_weights",
                  "update_weights", "open_weight_channel", "send_weights", "load_weights", "shutdown")


class LocalWorkerGroup:
    """Forwards the worker methods (and nothing else) to one in-process worker."""

    def __init__(self, worker: Any):
        self.worker = worker
        self.world_size = 1

    def __getattr__(self, name: str):
        if name in WORKER_METHODS:
            method = getattr(self.worker, name, None)
            if method is None:
                raise AttributeError(f"{type(self.worker).__name__} has no worker method {name!r}")
            return self._through_dispatch(method)
        raise AttributeError(f"{name!r} is not a worker method; worker groups expose {list(WORKER_METHODS)}")

    def _through_dispatch(self, method):
        """The method called as a group calls it (dispatch, run, collect) at world size 1."""
        reg = registration(method)

        @functools.wraps(method)
        def call(*args, **kwargs):
            (rank_args, rank_kwargs), = dispatch(reg.dispatch_mode, self.world_size, args, kwargs)
            out = collect(reg.dispatch_mode, [method(*rank_args, **rank_kwargs)])
            return out[0] if reg.dispatch_mode in (Dispatch.ONE_TO_ALL, Dispatch.ALL_TO_ALL) else out

        return call

    def execute(self, name: str, data: DataProto | None = None, **kwargs) -> Any:
        """Call worker method ``name`` (the form a remote group uses)."""
        method = getattr(self, name)
        return method(**kwargs) if data is None else method(data, **kwargs)
