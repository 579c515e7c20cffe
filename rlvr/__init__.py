"""rlvr: reinforcement learning from verifiable rewards (GRPO and its family), after verl."""

import os

# Bitwise-reproducible runs on CPU: MKL's reproducible mode (CBWR, "conditional numerical
# reproducibility"), which fixes its code paths and reduction orders. Two fresh runs of the
# built-in model without it once sampled the same tokens and differed in the last bits of the
# gradient; with it they agreed (tests/trainer/test_determinism.py says what was and was not
# shown). MKL reads this when torch first calls it, so it is set here, on import, before any
# matmul; child processes (ranks, Ray workers, vLLM's) inherit it. A user's value is kept.
os.environ.setdefault("MKL_CBWR", "AUTO,STRICT")
