"""The actor's weights to a rollout pool of its own, by collective broadcast.

With ``actor_rollout_ref.hybrid_engine=false`` (and ``trainer.v1.trainer_mode=separate_async``)
the rollout workers hold their own copy of the policy. After an update (or, async, when a
batch is dispatched) the actor's rank 0 broadcasts the weights to them over a process group
of its own (verl's checkpoint engine, ``actor_rollout_ref.rollout.checkpoint_engine``): a
``TCPStore`` at the actor rank 0's rendezvous address and gloo (CPU) or NCCL (GPU), rank 0
the actor's rank 0, ranks 1..N the rollout workers. The actor's ranks gather each tensor from
their FSDP2 shards in turn (``full_tensor``), rank 0 packs them into a bucket of
``update_weights_bucket_megabytes`` (raw bytes, several dtypes) and broadcasts it when full,
so no process ever holds a gathered state beside its own beyond one bucket, and nothing goes
through the driver or Ray's object store.

Each rollout worker receives on a thread of its own, always listening, into a staged copy
per weight version; the worker's own task thread loads a version (``take``) only when it is
complete and only between two generations (Ray runs one task of the worker at a time), so no
token is ever sampled under half-updated weights, and the actor's broadcast never waits for a
generation to end. A message is a header (the version; -1 closes) then the buckets, whose
layout both sides compute from the same tensor list (``bucket_plan``).
"""

from __future__ import annotations

import datetime
import math
import os
import threading
from typing import Iterable, Iterator

import torch

from rlvr.errors import StopTraining

TIMEOUT_S = 600  # a receiver that never joins, or a sender that never sends, fails after this
CLOSE = -1


class WeightSyncError(StopTraining):
    """The weight broadcast between the actor and the rollout pool failed."""


def weight_tensors(model: torch.nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """What the broadcast carries, in order: each parameter (tied ones once), then each persistent
    buffer (what ``state_dict`` holds beside them: GLM-4-MoE's router ``e_score_correction_bias``,
    which the rollout worker's ``load_state_dict`` would otherwise miss). Sharded tensors as they
    are: the sender's caller gathers each."""
    yield from model.named_parameters()
    yield from persistent_buffers(model)


def persistent_buffers(model: torch.nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, buffer) of the buffers ``state_dict`` holds (rotary tables and other non-persistent
    ones left out)."""
    for prefix, module in model.named_modules():
        for leaf, buffer in module.named_buffers(recurse=False):
            if buffer is not None and leaf not in module._non_persistent_buffers_set:
                yield f"{prefix}.{leaf}".lstrip("."), buffer


def weight_meta(model: torch.nn.Module) -> list[tuple[str, tuple[int, ...], str]]:
    """(name, shape, dtype) of each tensor ``weight_tensors`` yields: what the broadcast carries, in order."""
    return [(name, tuple(t.shape), str(t.dtype).removeprefix("torch.")) for name, t in weight_tensors(model)]


def bucket_plan(meta: list[tuple[str, tuple[int, ...], str]], bucket_bytes: int) -> list[list[int]]:
    """Consecutive tensors grouped into buckets of at most ``bucket_bytes`` (a larger tensor alone)."""
    buckets, current, size = [], [], 0
    for i, (_, shape, dtype) in enumerate(meta):
        nbytes = _nbytes(shape, dtype)
        if current and size + nbytes > bucket_bytes:
            buckets.append(current)
            current, size = [], 0
        current.append(i)
        size += nbytes
    if current:
        buckets.append(current)
    return buckets


def _nbytes(shape, dtype: str) -> int:
    return math.prod(shape) * getattr(torch, dtype).itemsize


def _layout(meta, bucket_bytes: int) -> list[tuple[int, list[tuple[int, int, int]]]]:
    """Per bucket, computed once for both sides: (its bytes, [(tensor index, offset, bytes), ...])."""
    layout = []
    for bucket in bucket_plan(meta, bucket_bytes):
        entries, offset = [], 0
        for i in bucket:
            n = _nbytes(*meta[i][1:])
            entries.append((i, offset, n))
            offset += n
        layout.append((offset, entries))
    return layout


class WeightGroup:
    """A process group of ``world_size`` for the broadcast alone, beside any default group."""

    def __init__(self, host: str, port: int, rank: int, world_size: int, backend: str, timeout_s: float = TIMEOUT_S):
        import torch.distributed as dist

        timeout = datetime.timedelta(seconds=timeout_s)
        self.store = dist.TCPStore(host, port, world_size, rank == 0, timeout=timeout, wait_for_workers=False)
        if backend == "gloo":
            options = dist.ProcessGroupGloo._Options()
            options._timeout = timeout
            options._devices = [dist.ProcessGroupGloo.create_device(hostname=host)]
            self.pg = dist.ProcessGroupGloo(self.store, rank, world_size, options)
            self.device = torch.device("cpu")
        elif backend == "nccl":
            options = dist.ProcessGroupNCCL.Options()
            options._timeout = timeout
            self.pg = dist.ProcessGroupNCCL(self.store, rank, world_size, options)
            self.device = torch.device("cuda", torch.cuda.current_device())
        else:
            raise ValueError(f"weight broadcast backend {backend!r}: gloo or nccl")

    def broadcast(self, tensor: torch.Tensor) -> None:
        self.pg.broadcast(tensor, 0).wait()


class WeightSender:
    """The actor's side: every actor rank calls ``send`` (the per-tensor gathers are collectives of
    the actor's own group); only rank 0 holds the group and broadcasts."""

    def __init__(self, group: WeightGroup | None, meta, bucket_bytes: int):
        self.group, self.meta = group, meta
        self.layout = _layout(meta, bucket_bytes)

    def send(self, version: int, tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Broadcast ``version``'s weights; ``tensors`` yields (name, full tensor) in ``meta``'s order
        (gathering each as it is asked for)."""
        group = self.group
        if group is not None:
            group.broadcast(torch.tensor([version], dtype=torch.int64, device=group.device))
        stream: Iterator = iter(tensors)
        for size, entries in self.layout:
            buffer = None if group is None else torch.empty(size, dtype=torch.uint8, device=group.device)
            for i, offset, n in entries:
                name, tensor = next(stream)
                expected, shape, dtype = self.meta[i]
                if name != expected or tuple(tensor.shape) != shape:
                    raise WeightSyncError(f"weight broadcast: the actor's tensor {name} {tuple(tensor.shape)} is not "
                                          f"the announced {expected} {shape}")
                if buffer is not None:
                    raw = tensor.detach().to(getattr(torch, dtype)).contiguous().view(-1).view(torch.uint8)
                    buffer[offset:offset + n].copy_(raw)
            if buffer is not None:
                group.broadcast(buffer)

    def close(self) -> None:
        if self.group is not None:
            self.group.broadcast(torch.tensor([CLOSE], dtype=torch.int64, device=self.group.device))


class WeightReceiver:
    """A rollout worker's side: a thread joins the group, then receives every version into a
    staged copy; ``take(version)`` waits for that version, complete, and drops older ones."""

    def __init__(self, connect, meta, bucket_bytes: int):
        self.meta = meta
        self.layout = _layout(meta, bucket_bytes)
        self.staged: dict[int, dict[str, torch.Tensor]] = {}
        self.error: BaseException | None = None
        self.closed = False
        self._ready = threading.Condition()
        self._thread = threading.Thread(target=self._run, args=(connect,), name="rlvr-weight-receiver", daemon=True)
        self._thread.start()

    def _run(self, connect) -> None:
        try:
            group = connect()
            while True:
                header = torch.zeros(1, dtype=torch.int64, device=group.device)
                group.broadcast(header)
                version = int(header.item())
                if version == CLOSE:
                    break
                weights = {}
                for size, entries in self.layout:
                    buffer = torch.empty(size, dtype=torch.uint8, device=group.device)
                    group.broadcast(buffer)
                    for i, offset, n in entries:
                        name, shape, dtype = self.meta[i]
                        weights[name] = buffer[offset:offset + n].view(getattr(torch, dtype)).view(shape)
                with self._ready:  # complete: only now can a generation see it
                    self.staged[version] = weights
                    self._ready.notify_all()
        except BaseException as err:  # reported by the next take
            with self._ready:
                self.error = err
                self._ready.notify_all()
            return
        with self._ready:
            self.closed = True
            self._ready.notify_all()

    def has(self, version: int) -> bool:
        with self._ready:
            return version in self.staged

    def take(self, version: int, timeout_s: float = TIMEOUT_S) -> dict[str, torch.Tensor]:
        """The weights of ``version``, once every bucket of it has arrived; older versions are dropped."""
        with self._ready:
            arrived = self._ready.wait_for(lambda: version in self.staged or self.error is not None or self.closed,
                                           timeout=timeout_s)
            if version not in self.staged:
                why = (f"the receiving thread failed: {type(self.error).__name__}: {self.error}" if self.error
                       else "the channel was closed" if self.closed
                       else f"nothing arrived in {timeout_s:.0f} s" if not arrived else "it never came")
                raise WeightSyncError(f"rollout worker (pid {os.getpid()}): weight version {version} was not "
                                      f"received: {why}")
            weights = self.staged.pop(version)
            for older in [v for v in self.staged if v < version]:
                del self.staged[older]
            return weights


def open_channel(actor_wg, rollout_wg, backend: str, bucket_megabytes: int) -> None:
    """Join the actor's rank 0 and every rollout worker in a broadcast group: the receivers start
    listening (their call returns at once), then the actor's rank 0 joins, which completes the
    rendezvous."""
    host, port = actor_wg.execute_rank_zero("weight_channel_address")
    meta = actor_wg.execute_rank_zero("weight_meta")
    bucket_bytes = bucket_megabytes << 20
    world_size = 1 + rollout_wg.world_size
    rollout_wg.open_weight_channel(host, port, world_size, backend, meta, bucket_bytes)
    actor_wg.open_weight_channel(host, port, world_size, backend, meta, bucket_bytes)
    layout = _layout(meta, bucket_bytes)
    print(f"[rlvr] weights reach the {rollout_wg.world_size} rollout workers by {backend} broadcast from the actor's "
          f"rank 0 ({host}:{port}): {sum(size for size, _ in layout) / 2**20:.0f} MB a version in {len(layout)} "
          f"bucket(s) of up to {bucket_megabytes} MB", flush=True)
