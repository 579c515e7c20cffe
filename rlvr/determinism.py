"""Same seed, same run, on a busy machine: what a process sets so that a run's numbers do not
depend on how many threads a call gets, on load, or on which thread of the process computes.

- ``MKL_CBWR=AUTO,STRICT``: MKL's strict reproducible mode (CBWR, "conditional numerical
  reproducibility"). Without it MKL splits a long reduction (the vocabulary projection's
  backward, a sum over 49,152 entries) over the threads it uses for the call, and the split
  changes the last bits: 1 and 2 threads differed by up to 4e-3 on one row
  (tests/trainer/test_determinism.py).
- ``MKL_DYNAMIC=FALSE`` and ``OMP_DYNAMIC=FALSE``: Intel's conditions for reproducible results
  ("Reproducibility Conditions" in the oneMKL developer guide) ask for a fixed thread count that
  the runtime does not adjust; strict mode covers only gemm, trsm and symm when the count
  changes. With dynamic threading MKL (and an OpenMP runtime that honours OMP_DYNAMIC, sizing
  teams from the load average) may give a call fewer threads on a loaded machine, and torch's
  own reductions split a sum by the team's size (``x.sum()`` of a 49,152 x 4 tensor gives other
  bits on 1 and 2 threads). torch turns MKL's dynamic mode off only when ``set_num_threads`` is
  called, and never OpenMP's.
- ``pin_threads``: torch's intra-op thread count is per thread under OpenMP, so every thread
  that computes (the trainer's, the generate-ahead thread) is given the same count.

Not a setting: an op whose CPU backward adds with parallel atomics (advanced indexing with a
repeated index) gives bits that follow the threads' scheduling, whatever the thread count; the
prompt-once forward picks its states with ``index_select`` for that reason
(``rlvr/workers/forward.py``, ``pick_states``).

These are read when MKL and OpenMP start, so they are set on ``import rlvr`` (before torch
loads them, in this process and in the children that inherit the environment: ranks, Ray
workers, vLLM's). A value the user set is kept.

Departure from verl: verl sets none of this (its GPU kernels are not bitwise deterministic);
rlvr promises that two runs of one config on one CPU are bitwise equal.
"""

from __future__ import annotations

import os

REPRODUCIBLE_ENV = {"MKL_CBWR": "AUTO,STRICT", "MKL_DYNAMIC": "FALSE", "OMP_DYNAMIC": "FALSE"}


def set_reproducible_env() -> None:
    """The environment above, where the user has not set it; before torch is imported."""
    for key, value in REPRODUCIBLE_ENV.items():
        os.environ.setdefault(key, value)


def pin_threads(threads: int | None = None) -> int:
    """Fix this thread's intra-op thread count (the current one unless ``threads`` is given) and
    return it. ``torch.set_num_threads`` also turns MKL's dynamic threading off."""
    import torch

    threads = max(1, threads or torch.get_num_threads())
    torch.set_num_threads(threads)
    return threads
