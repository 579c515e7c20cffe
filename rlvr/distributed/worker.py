"""A worker's place in its group, and the few collectives the data-parallel actor needs.

``Worker`` reads what a worker group sets in each process's environment (``RANK``,
``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``, ``MASTER_PORT``); without them it is the
only rank. ``DataParallel`` is what the actor and critic see of the group: their rank's
share of a mini-batch (whole prompt groups) and sums/maxima over the ranks, which are
identities at world size 1, so one code path serves one process and many.
"""

from __future__ import annotations

import os
import socket
from datetime import timedelta

import torch
import torch.distributed as dist

LOOPBACK = "127.0.0.1"


def free_port(host: str = LOOPBACK) -> int:
    """A TCP port free on ``host`` now (the loopback by default: nothing listens elsewhere)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


class Worker:
    """Base of the worker classes: rank, world size and rendezvous address from the environment."""

    def __init__(self):
        env = os.environ
        self.rank = int(env.get("RANK", 0))
        self.world_size = int(env.get("WORLD_SIZE", 1))
        self.local_rank = int(env.get("LOCAL_RANK", 0))
        self.master_addr = env.get("MASTER_ADDR", LOOPBACK)
        self.master_port = env.get("MASTER_PORT")

    def init_process_group(self, device: torch.device, timeout_s: float = 1800) -> None:
        """Join the group's ``torch.distributed`` process group (gloo on the CPU, NCCL for CUDA
        tensors, gloo for CPU tensors beside it). On one machine everything binds to 127.0.0.1."""
        if dist.is_initialized():
            return
        os.environ["MASTER_ADDR"] = self.master_addr
        os.environ["MASTER_PORT"] = str(self.master_port or free_port())
        if self.master_addr == LOOPBACK:
            os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
        backend = "cpu:gloo,cuda:nccl" if device.type == "cuda" else "gloo"
        dist.init_process_group(backend, rank=self.rank, world_size=self.world_size,
                                timeout=timedelta(seconds=timeout_s))

    def data_parallel(self) -> "DataParallel":
        return DataParallel(self.rank, self.world_size)


class DataParallel:
    """This rank among ``world_size`` data-parallel ranks (world size 1: every call is an identity)."""

    def __init__(self, rank: int = 0, world_size: int = 1):
        self.rank, self.world_size = rank, world_size

    def share(self, groups: list[list[int]]) -> list[int]:
        """This rank's rows of a mini-batch given as whole groups: the rank-th of ``world_size``
        contiguous, equal runs of groups (the config guarantees the division)."""
        if len(groups) % self.world_size:
            raise ValueError(f"{len(groups)} groups cannot be split evenly over {self.world_size} ranks")
        per = len(groups) // self.world_size
        return [row for group in groups[self.rank * per:(self.rank + 1) * per] for row in group]

    def sum(self, values: list[float]) -> list[float]:
        """Element-wise sums over the ranks."""
        if self.world_size == 1 or not values:
            return list(values)
        tensor = torch.tensor(values, dtype=torch.float64)
        dist.all_reduce(tensor)
        return tensor.tolist()

    def sum_(self, tensor: torch.Tensor) -> torch.Tensor:
        """In-place sum over the ranks of a CPU tensor."""
        if self.world_size > 1:
            dist.all_reduce(tensor)
        return tensor

    def max(self, value: int) -> int:
        if self.world_size == 1:
            return value
        tensor = torch.tensor([value], dtype=torch.int64)
        dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
        return int(tensor)

    def broadcast_object(self, obj):
        """Rank 0's ``obj`` (picklable) on every rank."""
        if self.world_size == 1:
            return obj
        box = [obj]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def barrier(self) -> None:
        if self.world_size > 1:
            dist.barrier()


SINGLE = DataParallel()
