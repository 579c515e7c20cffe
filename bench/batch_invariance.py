"""How far a request's tokens depend on its neighbours in the engine core (issue "Requests, not
batches": measure it).

    python bench/batch_invariance.py --requests 16 --max-new-tokens 64

Each request (an arithmetic prompt of the built-in task, T = 1, its own seed) is generated three
ways with the built-in model: alone; with the others, submitted together; and admitted one by
one every few steps beside them, at most --max-num-seqs rows (continuous batching, other rows
joining and leaving). A request's uniforms are its own in every case, so any difference comes
from the logits' last bits (a matrix product's blocking follows the row count). It prints how
many requests kept every token, where the first differing token came, and the largest
log-prob difference over the tokens they share.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from runs import at_least

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=at_least(1), default=16)
    ap.add_argument("--max-new-tokens", type=at_least(1), default=64)
    ap.add_argument("--max-num-seqs", type=at_least(1), default=6)
    ap.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
    args = ap.parse_args()

    from rlvr.config.schema import RolloutConfig
    import random

    from rlvr.data.tasks.arithmetic import PROMPT_TEMPLATE, ArithmeticSpec, make_problem
    from rlvr.models import load_model, load_tokenizer
    from rlvr.rollout import NativeRollout, SamplingParams
    from rlvr.rollout.core import Request

    model, tokenizer = load_model("builtin"), load_tokenizer("builtin")
    rng = random.Random(1)
    questions = [PROMPT_TEMPLATE.format(expression=make_problem(rng, ArithmeticSpec())[0]) for _ in range(args.requests)]
    prompts = [tokenizer.encode(tokenizer.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True,
                                                          tokenize=False), add_special_tokens=False) for q in questions]

    def requests():
        return [Request(f"r{i}", list(p), SamplingParams(max_new_tokens=args.max_new_tokens, seed=1000 + i))
                for i, p in enumerate(prompts)]

    def core(max_num_seqs=1024):
        return NativeRollout(model, tokenizer, RolloutConfig(max_num_seqs=max_num_seqs, dtype=args.dtype),
                             args.max_new_tokens).core

    alone = [core().run([r])[0] for r in requests()]
    together = core().run(requests())
    staggered_core = core(args.max_num_seqs)
    seqs = []
    for r in requests():
        seqs.append(staggered_core.add(r))
        for _ in range(3):
            staggered_core.step()
    while any(s.finish_reason is None for s in seqs):
        staggered_core.step()
    staggered = [s.completion() for s in seqs]

    for name, runs in (("submitted together", together), (f"admitted every 3 steps, <= {args.max_num_seqs} rows", staggered)):
        same, firsts, gap = 0, [], 0.0
        for a, b in zip(alone, runs):
            n = next((i for i, (x, y) in enumerate(zip(a.token_ids, b.token_ids)) if x != y), None)
            if n is None and len(a.token_ids) == len(b.token_ids):
                same += 1
            else:
                firsts.append(n if n is not None else min(len(a.token_ids), len(b.token_ids)))
            k = firsts[-1] if n is not None else min(len(a.log_probs), len(b.log_probs))
            gap = max([gap] + [abs(x - y) for x, y in zip(a.log_probs[:k], b.log_probs[:k])])
        print(f"{name}: {same}/{len(alone)} requests keep every token of their run alone"
              + (f"; the others part at tokens {sorted(firsts)}" if firsts else "")
              + f"; largest log-prob difference over shared tokens {gap:.2e}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
