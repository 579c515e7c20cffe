"""Reward scoring throughput: samples/s of the gsm8k and math scorers on 10,000 responses,
scored in the trainer process (serial) and in the process pool (``reward.num_workers``).

    .venv/bin/python bench/rewards.py [--samples 10000] [--workers N] [--repeats 3]

Responses are realistic and varied: GSM8K-style reasoning ending in ``#### 1,234`` (right,
wrong, or missing the marker), and MATH-style answers in ``\\boxed{...}`` with fractions,
LaTeX and plain numbers (right and wrong). Timing covers the manager's whole ``compute``:
decoding the token ids, scoring, and placing scores on the last token. Both are warmed up first
(the pool's workers started), then alternate ``--repeats`` times, the order flipping every repeat;
the ratio printed is the median of the per-repeat ratios. ``--workers`` defaults to the CPU count.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import time

import torch

from rlvr.config.schema import RewardConfig
from rlvr.models import load_tokenizer
from rlvr.protocol import DataProto
from rlvr.rewards import RewardManager
from runs import at_least


def gsm8k_sample(rng: random.Random) -> tuple[str, str]:
    a, b = rng.randint(10, 2000), rng.randint(2, 40)
    truth = a * b
    answer = truth if rng.random() < 0.5 else truth + rng.randint(1, 9)
    text = (f"Each box holds {a} apples and there are {b} boxes. So the total is {a} * {b} = {answer:,}. "
            f"She sells them all.\n#### {answer:,}")
    if rng.random() < 0.1:
        text = text.replace("#### ", "The answer is ")
    return text, str(truth)


MATH_FORMS = [
    (r"\frac{3}{4}", "0.75"), (r"\frac{1}{2}", r"\frac{1}{2}"), (r"2\sqrt{3}", r"2\sqrt{3}"), ("12", "12"),
    (r"\dfrac{5}{8}", r"\frac{5}{8}"), (r"x^2+1", r"1+x^2"), ("0.2", r"\frac{1}{5}"), (r"\pi", r"\pi"),
]


def math_sample(rng: random.Random) -> tuple[str, str]:
    answer, truth = rng.choice(MATH_FORMS)
    if rng.random() < 0.4:
        answer = rng.choice(MATH_FORMS)[0]
    return f"We simplify the expression step by step and find the result.\nThe answer is $\\boxed{{{answer}}}$.", truth


def make_batch(tokenizer, kind: str, samples: int) -> DataProto:
    rng = random.Random(0)
    make = gsm8k_sample if kind == "gsm8k" else math_sample
    pairs = [make(rng) for _ in range(samples)]
    ids = tokenizer([t for t, _ in pairs], add_special_tokens=False)["input_ids"]
    width = max(map(len, ids))
    responses = torch.full((samples, width), tokenizer.pad_token_id)
    mask = torch.zeros(samples, width, dtype=torch.long)
    for i, row in enumerate(ids):
        responses[i, :len(row)], mask[i, :len(row)] = torch.tensor(row), 1
    source = "openai/gsm8k" if kind == "gsm8k" else "HuggingFaceH4/MATH-500"  # math-verify's scorer (verl's math_reward)
    return DataProto.from_dict({"responses": responses, "response_mask": mask},
                               {"data_source": [source] * samples,
                                "reward_model": [{"ground_truth": truth} for _, truth in pairs],
                                "extra_info": [{"index": i} for i in range(samples)]})


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=at_least(1), default=10_000)
    parser.add_argument("--workers", type=at_least(1), default=os.cpu_count() or 2, help="the pool's processes")
    parser.add_argument("--repeats", type=at_least(1), default=3)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    tokenizer = load_tokenizer("builtin")
    print(f"{args.samples} responses per scorer; pool of {args.workers} processes; {os.cpu_count()} CPUs; "
          f"{args.repeats} repeats")
    for kind in ("gsm8k", "math"):
        batch = make_batch(tokenizer, kind, args.samples)
        managers = {"serial": RewardManager(tokenizer, RewardConfig(num_workers=0)),
                    f"pool({args.workers})": RewardManager(tokenizer, RewardConfig(num_workers=args.workers))}
        for manager in managers.values():  # warm-up, not timed: the pool's workers start, the scorers import
            manager.compute(batch[:args.workers * 4])
        rates = {label: [] for label in managers}
        means = {}
        for repeat in range(args.repeats):
            order = list(managers) if repeat % 2 == 0 else list(managers)[::-1]  # flips every repeat: the machine drifts
            for label in order:
                start = time.perf_counter()
                result = managers[label].compute(batch)
                rates[label].append(args.samples / (time.perf_counter() - start))
                means[label] = float(result.token_level_scores.sum(-1).mean())
        for manager in managers.values():
            manager.close()
        serial, pooled = rates.values()
        ratios = [p / s for p, s in zip(pooled, serial)]
        line = "  ".join(f"{label} {statistics.median(r):8.0f} samples/s" for label, r in rates.items())
        print(f"{kind:<6} median {line}  pool/serial median {statistics.median(ratios):.2f}x "
              f"(range {min(ratios):.2f}-{max(ratios):.2f}; mean score {means['serial']:.3f}, "
              f"same in both: {len(set(means.values())) == 1})")


if __name__ == "__main__":
    main()
