"""Greedy validation of the built-in arithmetic task's 300 test problems with the native engine,
the prompts' common opening (the chat template's system prompt) prefilled once against every
prompt prefilled whole, alternating, in one process.

    .venv/bin/python bench/prefill.py [--repeats 2]

Prints each run's seconds and prompt tokens prefilled, whether both give the same tokens, and
the median ratio whole / shared of the seconds.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch

import rlvr.rollout.engine as engine_module
from rlvr.config.schema import RolloutConfig
from rlvr.data import RLHFDataset
from rlvr.data.prepare import prepare_arithmetic
from rlvr.models import load_model_and_tokenizer
from rlvr.rollout import NativeRollout, SamplingParams

DATA = Path("~/data/arithmetic").expanduser()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--repeats", type=int, default=2)
    args = p.parse_args()
    torch.set_num_threads(max(1, torch.get_num_threads()))
    if not (DATA / "test.parquet").exists():
        prepare_arithmetic(DATA)
    model, tokenizer = load_model_and_tokenizer("builtin")
    ids = RLHFDataset([DATA / "test.parquet"], tokenizer).prompt_ids  # as validation tokenises them
    print(f"{len(ids)} prompts of {sum(map(len, ids)) / len(ids):.1f} tokens, "
          f"{engine_module.common_prefix_length(ids)} of them common to all")
    minimum = engine_module.SHARED_PREFIX_MIN_TOKENS
    seconds: dict[bool, list[float]] = {True: [], False: []}
    tokens: dict[bool, list] = {}
    for r in range(args.repeats):
        for shared in ((True, False) if r % 2 == 0 else (False, True)):
            engine_module.SHARED_PREFIX_MIN_TOKENS = minimum if shared else 10 ** 9
            engine = NativeRollout(model, tokenizer, RolloutConfig(), 64)
            start = time.perf_counter()
            out = engine.generate(ids, SamplingParams(max_new_tokens=64, do_sample=False))
            seconds[shared].append(time.perf_counter() - start)
            tokens[shared] = [c.token_ids for c in out]
            print(f"repeat {r}, {'opening shared' if shared else 'every prompt whole'}: {seconds[shared][-1]:.1f} s, "
                  f"prompt tokens prefilled {engine.prefill_tokens['computed']} (taken from the shared opening "
                  f"{engine.prefill_tokens['reused']})")
    engine_module.SHARED_PREFIX_MIN_TOKENS = minimum
    ratios = [whole / shared for whole, shared in zip(seconds[False], seconds[True])]
    print(f"same tokens: {tokens[True] == tokens[False]}; whole / shared: median {statistics.median(ratios):.2f}x "
          f"(range {min(ratios):.2f}-{max(ratios):.2f})")


if __name__ == "__main__":
    main()
