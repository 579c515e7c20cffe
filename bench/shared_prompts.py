"""One decode step with a group's prompt read once (the engine core's shared prompts) against every
row reading its own copy, on the built-in model, at GRPO's shapes: G prompts x n rows, each prompt
a long system prompt and a question, 30 tokens generated before the step is timed.

    .venv/bin/python bench/shared_prompts.py [--repeats 4]

Both variants run the same step on the same cache state in one process, alternating; the minimum
of 10 steps per repeat is kept (the machine drifts), and the median over repeats is printed with
the ratio.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from rlvr.config.schema import RolloutConfig
from rlvr.models import load_model_and_tokenizer
from rlvr.rollout import NativeRollout
from rlvr.rollout.core import Request
from rlvr.rollout.sampling import SamplingParams
from runs import at_least

SHAPES = [(40, 8, 8), (3, 8, 8), (40, 4, 16), (120, 8, 8)]  # system prompt repeats, prompts, rows a prompt


def step_ms(engine, prefixes, steps: int = 10) -> float:
    """Milliseconds of the fastest of ``steps`` decode steps on the core's current cache (the cache's
    length restored after each: every step sees the same state)."""
    core = engine.core
    tokens = torch.zeros(len(core.running), dtype=torch.long)
    mask = torch.cat([core.mask, core.mask.new_ones(len(core.running), 1)], dim=1)
    length = core.slab.length
    best = float("inf")
    for _ in range(steps):
        start = time.perf_counter()
        if prefixes is None:
            engine.lean.step(tokens, mask, core.last_pos, core.slab.cache)
        else:
            engine.lean.step(tokens, mask, core.last_pos, core.slab.cache, prefixes=prefixes)
        best = min(best, time.perf_counter() - start)
        for layer in core.slab.layers:
            layer.length = length
    return best * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=at_least(1), default=4)
    args = parser.parse_args()
    model, tokenizer = load_model_and_tokenizer("builtin")
    engine = NativeRollout(model, tokenizer, RolloutConfig(), 256)
    core = engine.core
    for repeats, prompts, n in SHAPES:
        system = "You are a careful assistant. " * repeats
        ids = [tokenizer.apply_chat_template([{"role": "system", "content": system},
                                              {"role": "user", "content": f"What is {i} + {3 * i}?"}],
                                             add_generation_prompt=True, tokenize=True, return_dict=False)
               for i in range(prompts)]
        params = SamplingParams(max_new_tokens=200, do_sample=False)
        for i, prompt in enumerate(ids):
            for j in range(n):
                core.add(Request(f"{i}.{j}", prompt, params, group=i, ignore_eos=True))
        with torch.inference_mode():
            for _ in range(30):
                core.step()
            prefixes = core._shared_prefixes()
            own, shared = [], []
            for _ in range(args.repeats):
                own.append(step_ms(engine, None))
                shared.append(step_ms(engine, prefixes) if prefixes is not None else float("nan"))
        a = statistics.median(own)
        line = (f"{prompts} prompts of {len(ids[0])} tokens x n={n} ({len(core.running)} rows, {core.slab.length} "
                f"columns): each row its own prompt {a:.1f} ms a step")
        if prefixes is None:
            line += "; below the core's threshold (SHARED_COLUMN_READS_MIN), the engine reads each row's own"
        else:
            b = statistics.median(shared)
            line += f", shared {b:.1f} ms: {a / b:.2f}x"
        print(line, flush=True)
        core.abort_all()
        core.release()


if __name__ == "__main__":
    main()
