"""Reproducible, resumable iteration over a dataset in batches of prompts.

The order of epoch ``e`` is a permutation drawn from ``(seed, e)`` alone, so it does not
depend on what ran before; the state is (epoch, offset into the epoch). A run that saves
the state after k batches and resumes from it sees exactly the batches an uninterrupted
run would have seen: none repeated, none skipped. Incomplete last batches are dropped
(every training step has ``train_batch_size`` prompts), as verl's dataloader does.
"""

from __future__ import annotations

from typing import Any, Iterator

import numpy as np

from rlvr.protocol import DataProto


class ResumableSampler:
    """Yields batches of row indices; ``state_dict`` / ``load_state_dict`` resume exactly."""

    def __init__(self, num_rows: int, batch_size: int, shuffle: bool = True, seed: int = 1, drop_last: bool = True):
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if drop_last and num_rows < batch_size:
            raise ValueError(
                f"the dataset has {num_rows} rows, fewer than one batch of {batch_size}; "
                "lower data.train_batch_size or add rows"
            )
        self.num_rows, self.batch_size = num_rows, batch_size
        self.shuffle, self.seed, self.drop_last = shuffle, seed, drop_last
        self.epoch, self.offset = 0, 0

    def __len__(self) -> int:
        """Batches per epoch."""
        full, rest = divmod(self.num_rows, self.batch_size)
        return full + (0 if self.drop_last or rest == 0 else 1)

    def epoch_order(self, epoch: int) -> np.ndarray:
        if not self.shuffle:
            return np.arange(self.num_rows)
        return np.random.default_rng([self.seed, epoch]).permutation(self.num_rows)

    def iter_epoch(self) -> Iterator[np.ndarray]:
        """The remaining batches of the current epoch; afterwards the state points at the next epoch."""
        order = self.epoch_order(self.epoch)
        while self.offset < len(self) * self.batch_size:
            start = self.offset
            self.offset += self.batch_size  # advance first: a yielded batch counts as consumed
            yield order[start:start + self.batch_size]
        self.epoch, self.offset = self.epoch + 1, 0

    def state_dict(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "offset": self.offset, "seed": self.seed, "num_rows": self.num_rows,
                "batch_size": self.batch_size, "shuffle": self.shuffle}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for key in ("num_rows", "batch_size", "seed", "shuffle"):
            if state[key] != getattr(self, key):
                raise ValueError(
                    f"cannot resume the data sampler: the saved {key} is {state[key]} but this run's is "
                    f"{getattr(self, key)}; resume with the same dataset and data.* settings, or start fresh"
                )
        self.epoch, self.offset = int(state["epoch"]), int(state["offset"])


class PromptLoader:
    """Batches of a dataset as DataProto, in the order of a ResumableSampler."""

    def __init__(self, dataset, batch_size: int, shuffle: bool = True, seed: int = 1, drop_last: bool = True):
        self.dataset = dataset
        self.sampler = ResumableSampler(len(dataset), batch_size, shuffle, seed, drop_last)

    def __len__(self) -> int:
        return len(self.sampler)

    def __iter__(self) -> Iterator[DataProto]:
        for indices in self.sampler.iter_epoch():
            yield self.dataset.collate([self.dataset[int(i)] for i in indices])

    def state_dict(self) -> dict[str, Any]:
        return self.sampler.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.sampler.load_state_dict(state)
