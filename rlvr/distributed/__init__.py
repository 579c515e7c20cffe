"""Worker groups: how the trainer reaches its workers (in-process today; Ray later)."""

from rlvr.distributed.worker_group import WORKER_METHODS, LocalWorkerGroup

__all__ = ["WORKER_METHODS", "LocalWorkerGroup"]
