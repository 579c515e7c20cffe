"""How far the rollout engine's log-probs of its own sampled tokens lie from the actor's, with
fresh weights: the noise the parity guard and the log-prob drift check (rlvr/trainer/guards.py)
must tolerate, and how often each check would stop a healthy run.

    .venv/bin/python bench/parity_noise.py [--model tiny|builtin|random] [--dtype bfloat16]
        [--batches 4] [--logit-offset 0] [overrides ...]
    .venv/bin/python bench/parity_noise.py --model random --logit-offset 48   # the bf16 worst case

``random`` is a random Llama of ``--hidden`` width and ``--layers`` layers over the built-in
vocabulary; ``--logit-offset`` adds a constant to every logit (a forward hook on the head, in
the head's own dtype; 48 is the review's worst case for bf16: logits in [32, 64), where one bf16
rounding step is 0.25). A constant leaves the distribution unchanged, so only rounding moves.
The engine's lean decode step computes the head from its weight, past the hook, so with an
offset the rollout runs ``rollout.lean_decode=false``: every step through the model's forward.

The trainer's own stages run on the default job's shape (8 prompts x n=8 per batch): the
engine samples (``rollout.dtype``), the actor recomputes (fp32, grouped prompt-once layout),
``--batches`` batches at the same weights. Printed per batch: mean and max |log p_engine - log
p_actor| over the sampled tokens; then the greedy probe's largest logit gap on the same weights
(the argmax check; its tolerance with a 16-bit side is two bf16 steps at the largest |logit|, at
least 0.25), and how many batches each check would have stopped.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import numpy as np
import torch

from rlvr.config import load_config
from rlvr.errors import StopTraining
from rlvr.models import model_folder, save_tiny_model
from rlvr.trainer.guards import drift_threshold, log_prob_gap, parity_tolerance
from rlvr.trainer.main import build_trainer
from runs import at_least, override_key

LEAN_DECODE = "actor_rollout_ref.rollout.lean_decode"


def random_model(out: Path, hidden: int, layers: int) -> Path:
    from transformers import LlamaConfig, LlamaForCausalLM

    from rlvr.models import load_tokenizer
    tokenizer = load_tokenizer("builtin")
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=hidden, intermediate_size=4 * hidden,
                         num_hidden_layers=layers, num_attention_heads=hidden // 64, num_key_value_heads=hidden // 128,
                         head_dim=64, tie_word_embeddings=False, bos_token_id=tokenizer.bos_token_id,
                         eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    torch.manual_seed(0)
    model = LlamaForCausalLM(config)
    with torch.no_grad():  # logits of a trained model's spread (std ~3) rather than the init's ~0.6
        model.lm_head.weight.mul_(5.0)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", choices=("tiny", "builtin", "random"), default="tiny")
    parser.add_argument("--dtype", choices=("float32", "bfloat16"), default="bfloat16")
    parser.add_argument("--batches", type=at_least(1), default=4)
    parser.add_argument("--hidden", type=at_least(128), default=1024, help="--model random: a multiple of 128")
    parser.add_argument("--layers", type=at_least(1), default=2, help="--model random")
    parser.add_argument("--logit-offset", type=float, default=0.0)
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args(argv)
    shape = {"hidden": args.hidden, "layers": args.layers}
    if args.model != "random" and shape != {k: parser.get_default(k) for k in shape}:
        parser.error("--hidden and --layers shape --model random only")
    if args.hidden % 128:  # 64-wide heads, half as many key-value heads
        parser.error(f"--hidden {args.hidden} is not a multiple of 128")
    if args.logit_offset and any(override_key(o) == LEAN_DECODE for o in args.overrides):
        parser.error(f"--logit-offset sets {LEAN_DECODE}=false (the hook on the head misses the lean step): "
                     "leave that key out")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    tmp = Path(tempfile.mkdtemp())
    path = {"tiny": lambda: save_tiny_model(tmp / "m", tokenizer_path=str(model_folder("builtin"))),
            "builtin": lambda: "builtin",
            "random": lambda: random_model(tmp / "m", args.hidden, args.layers)}[args.model]()
    overrides = list(args.overrides)
    if args.logit_offset:  # the lean decode step computes the head from its weight, past the hook
        overrides.append(f"{LEAN_DECODE}=false")
        print(f"--logit-offset {args.logit_offset:g}: {LEAN_DECODE}=false, so every engine step runs the model's "
              "forward (and the hook on its head)", flush=True)
    config = load_config(None, [f"actor_rollout_ref.model.path={path}", f"actor_rollout_ref.rollout.dtype={args.dtype}",
                                f"trainer.default_local_dir={tmp / 'run'}", "trainer.logger=[]",
                                "trainer.freshness_check_freq=1", *overrides])
    trainer = build_trainer(config, progress_bar=False)
    worker = trainer.wg.worker
    if args.logit_offset:
        for model in {id(m): m for m in (worker.actor.model, worker.rollout.model)}.values():
            model.lm_head.register_forward_hook(lambda mod, inp, out: out + args.logit_offset)
    trainer.global_step = 1
    batches = trainer._batches()
    means, maxes = [], []
    for i in range(args.batches):
        prompts, _ = next(batches)
        batch, _ = trainer._rollout(prompts, i, {})
        batch = batch.union(trainer.wg.compute_log_prob(batch))
        mean, worst, _ = log_prob_gap(batch.batch["rollout_log_probs"], batch.batch["old_log_probs"],
                                      batch.batch["response_mask"])
        means.append(mean)
        maxes.append(worst)
        print(f"batch {i}: {int(batch.batch['response_mask'].sum())} tokens, mean |dlogp| {mean:.3g}, max {worst:.3g}",
              flush=True)
    threshold = drift_threshold(config, min(means))
    trainer.global_step = 2
    probe_stops, largest = 0, 0.0
    try:
        probe = trainer._check_freshness()
        largest = probe["training/freshness/max_abs_logit"]
        gap = (f"{probe['training/freshness/greedy_gap_max']:.3g} (tolerance "
               f"{probe['training/freshness/greedy_gap_tolerance']:.3g})")
    except StopTraining as stop:
        probe_stops, gap = 1, str(stop)[:200]
    tol_mean, tol_max = parity_tolerance(config, largest)  # the trainer's probe hands its largest |logit| over
    print(f"model {args.model} rollout.dtype {args.dtype} logit offset {args.logit_offset}: mean |dlogp| "
          f"{np.mean(means):.3g} (batches {min(means):.3g}-{max(means):.3g}), max {max(maxes):.3g}; parity tolerance "
          f"mean {tol_mean:g} max {tol_max:g} (largest |logit| {largest:.3g}): {sum(m > tol_mean or w > tol_max for m, w in zip(means, maxes))}/"
          f"{len(means)} batches over; drift threshold from the lowest batch {threshold:.3g}: "
          f"{sum(m > threshold for m in means)}/{len(means)} over; greedy probe gap {gap} "
          f"({probe_stops} stop)")


if __name__ == "__main__":
    main()
