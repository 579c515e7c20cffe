"""Greedy validation of the built-in arithmetic task's 300 test problems with the native engine,
the prompts' common opening (the chat template's system prompt) prefilled once against every
prompt prefilled whole, alternating, in one process.

    .venv/bin/python bench/prefill.py [--repeats 2]
    .venv/bin/python bench/prefill.py --rows-ab [--repeats 4]

After one untimed warm-up call (64 prompts), prints each run's seconds and prompt tokens
prefilled, whether both give the same tokens, and the median ratio whole / shared of the
seconds. ``--rows-ab`` instead compares prefilling the 300 prompts in chunks of
``core.PREFILL_ROW_TOKENS`` tokens against one forward over all of them: the seconds spent in
the prefill and in the whole generation, and the page faults.
"""

from __future__ import annotations

import argparse
import resource
import statistics
import time
from pathlib import Path

import torch

import rlvr.rollout.core as core_module
import rlvr.rollout.engine as engine_module
from rlvr.config.schema import RolloutConfig
from rlvr.data import RLHFDataset
from rlvr.data.prepare import prepare_arithmetic
from rlvr.models import load_model_and_tokenizer
from rlvr.rollout import NativeRollout, SamplingParams
from runs import at_least

DATA = Path("~/data/arithmetic").expanduser()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--repeats", type=at_least(1), default=2)
    p.add_argument("--rows-ab", action="store_true", help="prefill in row chunks against one forward")
    args = p.parse_args()
    torch.set_num_threads(max(1, torch.get_num_threads()))
    if not (DATA / "test.parquet").exists():
        prepare_arithmetic(DATA)
    model, tokenizer = load_model_and_tokenizer("builtin")
    ids = RLHFDataset([DATA / "test.parquet"], tokenizer).prompt_ids  # as validation tokenises them
    print(f"{len(ids)} prompts of {sum(map(len, ids)) / len(ids):.1f} tokens, "
          f"{engine_module.common_prefix_length(ids)} of them common to all")
    # warm-up, not timed: the first call pays lazy imports, thread start-up and first allocations
    NativeRollout(model, tokenizer, RolloutConfig(), 64).generate(ids[:64], SamplingParams(max_new_tokens=64, do_sample=False))
    if args.rows_ab:
        return rows_ab(model, tokenizer, ids, args.repeats)
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


def rows_ab(model, tokenizer, ids, repeats: int) -> None:
    chunk = core_module.PREFILL_ROW_TOKENS
    prefill = core_module.EngineCore._prefill
    spent: list[float] = []

    def timed(self, *args):
        start = time.perf_counter()
        out = prefill(self, *args)
        spent.append(time.perf_counter() - start)
        return out

    core_module.EngineCore._prefill = timed
    runs: dict[bool, list[tuple[float, float]]] = {True: [], False: []}
    tokens: dict[bool, list] = {}
    for r in range(repeats):
        for chunked in ((True, False) if r % 2 == 0 else (False, True)):
            core_module.PREFILL_ROW_TOKENS = chunk if chunked else 10 ** 9
            engine = NativeRollout(model, tokenizer, RolloutConfig(), 64)
            spent.clear()
            faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
            start = time.perf_counter()
            out = engine.generate(ids, SamplingParams(max_new_tokens=64, do_sample=False))
            seconds = time.perf_counter() - start
            faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults
            runs[chunked].append((sum(spent), seconds))
            tokens[chunked] = [(c.token_ids, c.log_probs) for c in out]
            print(f"repeat {r}, {f'chunks of {chunk} tokens' if chunked else 'one forward'}: prefill "
                  f"{sum(spent):.2f} s, generation {seconds:.2f} s, page faults {faults}", flush=True)
    core_module.EngineCore._prefill = prefill
    core_module.PREFILL_ROW_TOKENS = chunk
    print(f"same tokens and log-probs: {tokens[True] == tokens[False]}")
    for i, what in enumerate(("prefill", "generation")):
        ratios = [whole[i] / chunked[i] for whole, chunked in zip(runs[False], runs[True])]
        print(f"{what}: one forward / chunks median {statistics.median(ratios):.2f}x "
              f"(range {min(ratios):.2f}-{max(ratios):.2f})")


if __name__ == "__main__":
    main()
