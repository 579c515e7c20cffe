"""rlvr: reinforcement learning from verifiable rewards (GRPO and its family), after verl."""

import os

# Bitwise-reproducible runs on CPU: MKL's strict reproducible mode (CBWR, "conditional numerical
# reproducibility"). Without it MKL splits a long reduction (the vocabulary projection's
# backward, a sum over 49,152 entries) over the threads it decides to use for the call (its
# dynamic threading may take fewer than torch's), and the split changes the last bits: two
# fresh runs of the built-in model then differed in the gradient, then in the tokens
# (tests/trainer/test_determinism.py).
# MKL reads this when torch first calls it, so it is set here, on import, before any matmul;
# child processes (ranks, Ray workers, vLLM's) inherit it. A user's value is kept.
os.environ.setdefault("MKL_CBWR", "AUTO,STRICT")
