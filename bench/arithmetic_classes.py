"""Where a model stands on the built-in arithmetic task, by class of problem: greedy accuracy on
the 300 test problems for +, x, - with a result >= 0 and - with a negative result; then how
often sampling at T = 1 finds the answer of a negative-result subtraction (the signal GRPO's
groups can carry for that class); with ``--pass-at K``, each test problem sampled K times at T = 1,
by class: pass@K (a right answer among the K, what GRPO can reinforce into the greedy answer) and
mean@K.

    .venv/bin/python bench/arithmetic_classes.py [MODEL ...] [--negative-problems 24] [--n 16] [--pass-at 0]
    .venv/bin/python bench/arithmetic_classes.py builtin --pass-at 16   # pass@16 and mean@16 too

MODEL: ``builtin`` (default) or a checkpoint's actor folder, such as
``runs/rlvr/arithmetic_grpo/checkpoints/global_step_24/actor``. Run ``rlvr prepare arithmetic``
(or the default job once) first.
"""

from __future__ import annotations

import argparse
from collections import Counter
from pathlib import Path

import torch

from rlvr.config.schema import RolloutConfig
from rlvr.data import RLHFDataset
from rlvr.models import load_model_and_tokenizer
from rlvr.rewards.scorers.arithmetic import compute_score
from rlvr.rollout import NativeRollout, SamplingParams
from runs import at_least

DATA = Path("~/data/arithmetic").expanduser()


def problem_class(question: str, answer: int) -> str:
    """'+', 'x', '-' (result >= 0) or '- < 0' for a two-operand problem's text."""
    if " * " in question:
        return "x"
    if " - " in question:
        return "- < 0" if answer < 0 else "-"
    return "+"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("models", nargs="*", default=["builtin"])
    p.add_argument("--negative-problems", type=at_least(1), default=24, help="training problems with a negative result")
    p.add_argument("--n", type=at_least(0), default=16, help="samples of each at T = 1 (0: skip)")
    p.add_argument("--pass-at", type=at_least(0), default=0, help="samples of each test problem at T = 1 (0: skip)")
    args = p.parse_args()
    torch.set_num_threads(max(1, torch.get_num_threads()))
    for path in args.models:
        model, tokenizer = load_model_and_tokenizer(path)
        test, train = (RLHFDataset([DATA / f"{split}.parquet"], tokenizer) for split in ("test", "train"))
        engine = NativeRollout(model, tokenizer, RolloutConfig(), 64)
        greedy = engine.generate(test.prompt_ids, SamplingParams(max_new_tokens=64, do_sample=False))
        right, total = Counter(), Counter()
        for row, c in zip(test.rows, greedy):
            truth = row["reward_model"]["ground_truth"]
            cls = problem_class(row["prompt"][-1]["content"], int(truth))
            total[cls] += 1
            right[cls] += compute_score("arithmetic", tokenizer.decode(c.token_ids, skip_special_tokens=True), truth)
        classes = ", ".join(f"{cls} {right[cls]:.0f}/{total[cls]}" for cls in ("+", "x", "-", "- < 0"))
        print(f"{path}: greedy {sum(right.values()) / len(test.rows):.3f} ({classes}); "
              f"mean response {sum(len(c.token_ids) for c in greedy) / len(greedy):.1f} tokens")
        if args.pass_at:
            k = args.pass_at
            prompts = [ids for ids in test.prompt_ids for _ in range(k)]
            samples = engine.generate(prompts, SamplingParams(max_new_tokens=64, temperature=1.0, seed=0),
                                      groups=[i // k for i in range(len(prompts))])
            passed, mean = Counter(), Counter()
            for i, row in enumerate(test.rows):
                truth = row["reward_model"]["ground_truth"]
                hits = [compute_score("arithmetic", tokenizer.decode(c.token_ids, skip_special_tokens=True), truth)
                        for c in samples[i * k:(i + 1) * k]]
                cls = problem_class(row["prompt"][-1]["content"], int(truth))
                passed[cls] += any(hits)
                mean[cls] += sum(hits) / k
            classes = ", ".join(f"{cls} {passed[cls]}/{total[cls]}" for cls in ("+", "x", "-", "- < 0"))
            print(f"  T = 1, {k} samples a problem: pass@{k} {sum(passed.values()) / len(test.rows):.3f} ({classes}); "
                  f"mean@{k} {sum(mean.values()) / len(test.rows):.3f}")
        if args.n:
            picked = [i for i, r in enumerate(train.rows) if int(r["reward_model"]["ground_truth"]) < 0]
            negative = [train.rows[i] for i in picked[:args.negative_problems]]
            prompts = [train.prompt_ids[i] for i in picked[:args.negative_problems] for _ in range(args.n)]
            samples = engine.generate(prompts, SamplingParams(max_new_tokens=64, temperature=1.0, seed=0),
                                      groups=[i // args.n for i in range(len(prompts))])
            hits = [compute_score("arithmetic", tokenizer.decode(c.token_ids, skip_special_tokens=True),
                                  negative[i // args.n]["reward_model"]["ground_truth"]) for i, c in enumerate(samples)]
            solved = sum(any(hits[i * args.n:(i + 1) * args.n]) for i in range(len(negative)))
            print(f"  negative-result subtractions sampled at T = 1: {sum(hits):.0f} right of {len(hits)} "
                  f"({len(negative)} training problems x {args.n}); {solved} problems with a right sample")


if __name__ == "__main__":
    main()
