"""rlvr: reinforcement learning from verifiable rewards (GRPO and its family), after verl."""

from rlvr.determinism import set_reproducible_env

# MKL's strict reproducible mode and no dynamic threading (MKL's, OpenMP's): read when MKL and
# OpenMP start, so set here, on import, before torch loads them (rlvr/determinism.py says why).
set_reproducible_env()
