"""The native engine with a LoRA adapter against the same engine on the plain model, in one process.

    .venv/bin/python bench/lora_rollout.py [--rank 16] [--repeats 3]

The default workload (8 arithmetic prompts x n = 8, up to 128 new tokens, T = 1, fp32): the
built-in model alone, then wrapped with a LoRA adapter on every linear layer (B drawn small and
non-zero, so the adapter changes the output), alternating, seed r in both at repeat r. Prints
tokens/s of each and the median of the per-repeat ratios. The decode step merges the adapter into
its packed projections, so the ratio is near 1 (0.97x and 0.92x in two runs); computing the
low-rank term in every projection of every step instead measured 0.74x (docs/recipe.md, "With LoRA").
"""

from __future__ import annotations

import argparse
import statistics

import torch

from rlvr.config.schema import RolloutConfig
from rlvr.models import load_model_and_tokenizer
from rlvr.models.lora import apply_lora, unwrap
from rlvr.rollout import NativeRollout
from rollout import make_batch, timed
from runs import at_least


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rank", type=at_least(1), default=16)
    parser.add_argument("--repeats", type=at_least(1), default=3)
    args = parser.parse_args()
    config = RolloutConfig(temperature=1.0, dtype="float32")
    plain_model, tokenizer = load_model_and_tokenizer("builtin")
    adapted_model, _ = load_model_and_tokenizer("builtin")
    peft_model = apply_lora(adapted_model, rank=args.rank, alpha=2.0 * args.rank, target_modules="all-linear")
    torch.manual_seed(0)
    with torch.no_grad():
        for name, param in peft_model.named_parameters():
            if "lora_B" in name:
                param.normal_(std=1e-3)
    batch = make_batch(tokenizer, 8, 8)
    engines = {"plain": NativeRollout(plain_model, tokenizer, config, 128),
               f"LoRA r={args.rank}": NativeRollout(unwrap(peft_model).eval(), tokenizer, config, 128)}
    for engine in engines.values():
        timed(engine, batch[:8])  # warm-up: allocations, packing
    rates = {name: [] for name in engines}
    for repeat in range(args.repeats):
        order = list(engines) if repeat % 2 == 0 else list(engines)[::-1]
        for name in order:
            elapsed, tokens = timed(engines[name], batch, seed=repeat)
            rates[name].append(tokens / elapsed)
        print("  " + " | ".join(f"{name}: {rates[name][-1]:.1f} tokens/s" for name in engines), flush=True)
    plain, lora = rates.values()
    ratios = [a / b for a, b in zip(lora, plain)]
    print(f"LoRA r={args.rank} / plain: median {statistics.median(ratios):.2f}x (range {min(ratios):.2f}-{max(ratios):.2f}); "
          f"medians {statistics.median(lora):.1f} and {statistics.median(plain):.1f} tokens/s")


if __name__ == "__main__":
    main()
