"""Time per GRPO step of the default job (built-in model, arithmetic, 8 prompts x n=8) and its split.

    .venv/bin/python bench/step.py [--steps 3] [--config NAME|FILE] [overrides ...]

Prints, averaged over ``--steps`` steps after one warm-up step: seconds per step and per
stage (``timing_s/*``), generated tokens/s, training tokens/s (tokens through the update's
forward and backward), and the training phase's achieved FLOP/s as a fraction of this
machine's fp32 matmul peak, measured here with a large ``torch.mm``.

Training FLOPs are counted as 6 x (non-embedding parameters) per token through the
backbone plus 6 x (vocabulary projection) per response token (the projection runs only
there); attention-score FLOPs are left out (under 5% at these lengths).
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections import defaultdict

import numpy as np
import torch

from rlvr.config import load_config
from rlvr.trainer.main import build_trainer
from runs import at_least


def matmul_peak_gflops(size: int = 2048, repeats: int = 10) -> float:
    a, b = torch.randn(size, size), torch.randn(size, size)
    torch.mm(a, b)
    start = time.perf_counter()
    for _ in range(repeats):
        torch.mm(a, b)
    return 2 * size ** 3 * repeats / (time.perf_counter() - start) / 1e9


def parameter_counts(model) -> tuple[int, int]:
    """(backbone parameters without the embedding, parameters of the vocabulary projection)."""
    head = model.get_output_embeddings().weight
    embed = model.get_input_embeddings().weight
    body = sum(p.numel() for p in model.parameters() if p is not head and p is not embed)
    return body, head.numel()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=at_least(1), default=3, help="timed steps, after one warm-up step")
    parser.add_argument("--config", help="a shipped recipe (distill, dapo, ...) or a YAML file, as `rlvr train --config`")
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        config = load_config(args.config, [f"trainer.default_local_dir={tmp}", "trainer.logger=[]", "data.val_files=[]",
                                    "trainer.val_before_train=false", f"trainer.total_training_steps={args.steps + 1}",
                                    *args.overrides])
        trainer = build_trainer(config, progress_bar=False)
        model = trainer.wg.worker.actor.model
        body, head = parameter_counts(model)
        sums: dict[str, list[float]] = defaultdict(list)
        loader = iter(trainer.loader)
        for step in range(args.steps + 1):
            trainer.global_step += 1
            metrics = trainer.train_step(next(loader))
            if step == 0:
                continue  # warm-up
            for key, value in metrics.items():
                sums[key].append(value)
    mean = {k: float(np.mean(v)) for k, v in sums.items()}
    peak = matmul_peak_gflops()
    step_s = mean["timing_s/step"]
    print(f"config: {config.data.train_batch_size} prompts x n={config.actor_rollout_ref.rollout.n}, "
          f"max_response_length={config.data.max_response_length}, actor dtype={config.actor_rollout_ref.actor.dtype}, "
          f"rollout dtype={config.actor_rollout_ref.rollout.dtype}, threads={torch.get_num_threads()}")
    print(f"time per step: {step_s:.2f} s (mean of {args.steps} steps after one warm-up step)")
    every_step = [k for k in mean if k.startswith("timing_s/") and k != "timing_s/step" and len(sums[k]) == args.steps]
    for key in sorted(every_step):
        print(f"  {key:<28} {mean[key]:7.2f} s  {100 * mean[key] / step_s:5.1f}%")
    if "timing_s/freshness_probe" in mean:  # steps 1, 2 and every freshness_check_freq: its share, amortised
        freq, run_steps = config.trainer.freshness_check_freq, 24  # over the default job's 24 steps
        probes = len({1, 2} | set(range(freq, run_steps + 1, freq)))  # ppo_trainer's _freshness_due
        probe_s = mean["timing_s/freshness_probe"]
        print(f"  freshness probe: {probe_s:.2f} s when it runs (steps 1, 2 and every {freq}: {probes} times in a "
              f"{run_steps}-step run): {100 * probe_s * probes / run_steps / step_s:.2f}% of a step over such a run")
    gen_tokens = mean["response_length/mean"] * config.data.train_batch_size * config.actor_rollout_ref.rollout.n
    print(f"generated tokens/s: {gen_tokens / mean['timing_s/gen']:.1f} ({gen_tokens:.0f} tokens per step)")
    fwd_tokens, resp_tokens = mean["perf/actor_forward_tokens"], mean["perf/actor_response_tokens"]
    update_s = mean["timing_s/update_actor"]
    flops = 6 * body * fwd_tokens + 6 * head * resp_tokens
    print(f"training tokens/s: {fwd_tokens / update_s:.1f} ({fwd_tokens:.0f} tokens through forward+backward, "
          f"{resp_tokens:.0f} of them response tokens)")
    print(f"training FLOP/s: {flops / update_s / 1e9:.1f} GFLOP/s = {100 * flops / update_s / 1e9 / peak:.1f}% "
          f"of the measured fp32 matmul peak ({peak:.1f} GFLOP/s)")


if __name__ == "__main__":
    main()
