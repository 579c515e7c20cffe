"""Recipe variants x seeds of the default job, every run its own ``rlvr train`` process, all at once.

    python bench/sweep.py [--device cuda] [--deadline 345] [--steps 24] [--out outputs/sweep]

Meant for one GPU (each run holds ~5 GB and one CPU core; fp32 as on the CPU, ``actor.strategy=
local``); on a 2-core CPU run one variant at a time instead. Runs still going at ``--deadline``
seconds are stopped: their last validation (step 0, 12, ...) is what they report. Prints and
writes ``sweep.json``: each run's greedy accuracy at each validation, last entropy and KL loss.
docs/recipe.md's sweeps ran this on lent H200s (seed S: ``rollout.seed=S``, ``data.seed=S+1``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from runs import at_least, fresh_run_dir

FP32 = ["actor_rollout_ref.actor.dtype=float32", "actor_rollout_ref.rollout.dtype=float32"]
VARIANTS = {
    "recipe": [],
    "n16x4": ["data.train_batch_size=4", "actor_rollout_ref.actor.ppo_mini_batch_size=4", "actor_rollout_ref.rollout.n=16"],
    "lr2e-5": ["actor_rollout_ref.actor.optim.lr=2e-5"],
    "T1.2": ["actor_rollout_ref.rollout.temperature=1.2"],
    "drgrpo": ["algorithm.norm_adv_by_std_in_grpo=false"],
    # 16 prompts a step (twice the generation and update of the recipe's 8)
    "bs16": ["data.train_batch_size=16", "actor_rollout_ref.actor.ppo_mini_batch_size=16"],
    # DAPO's dynamic sampling: only groups whose rewards differ are trained on
    "filter": ["algorithm.filter_groups.enable=true", "data.gen_batch_size=12"],
    # two optimizer steps a batch with clip-higher (the best CPU variant, mean of 4 runs 0.565)
    "mb4ch": ["actor_rollout_ref.actor.ppo_mini_batch_size=4", "actor_rollout_ref.actor.clip_ratio_high=0.28"],
}


def read_run(run_dir: Path) -> dict:
    val, last = {}, {}
    metrics = run_dir / "metrics.jsonl"
    for line in open(metrics) if metrics.exists() else []:
        record = json.loads(line)
        val.update({record["step"]: v for k, v in record.items() if k.startswith("val-core/") and k.endswith("mean@1")})
        last = record if "actor/entropy" in record else last
    return {"val": val, "entropy": last.get("actor/entropy"), "kl": last.get("actor/kl_loss"), "steps": last.get("step")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--deadline", type=float, default=345.0, help="seconds before unfinished runs are stopped")
    parser.add_argument("--steps", type=at_least(1), default=None, help="training steps (default: the recipe's 24)")
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--seeds", type=at_least(1), default=3)
    parser.add_argument("--runs", default=None, help="VARIANT_sSEED,... instead of every variant x seed")
    parser.add_argument("--out", default="outputs/sweep")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    procs = {}
    tags = args.runs.split(",") if args.runs else [f"{name}_s{seed}" for name in args.variants.split(",")
                                                   for seed in range(args.seeds)]
    parts = {tag: tag.rsplit("_s", 1) for tag in tags}
    unknown = [tag for tag, (name, *seed) in parts.items() if name not in VARIANTS or not "".join(seed).isdigit()]
    if unknown:
        parser.error(f"unknown runs {unknown}: each is VARIANT_sSEED, VARIANT one of {', '.join(VARIANTS)}")
    runs = {tag: (name, int(seed)) for tag, (name, seed) in parts.items()}  # tag -> (variant, seed)
    for tag in runs:
        fresh_run_dir(out / tag)
    for tag, (name, seed) in runs.items():
        command = [sys.executable, "-m", "rlvr.cli", "train", f"trainer.device={args.device}",
                   "actor_rollout_ref.actor.strategy=local", f"actor_rollout_ref.rollout.seed={seed}",
                   f"data.seed={seed + 1}", f"trainer.default_local_dir={out / tag}", "trainer.resume_mode=disable",
                   "trainer.save_freq=-1", "trainer.logger=[jsonl]", *FP32, *VARIANTS[name]]
        command += [f"trainer.total_training_steps={args.steps}"] if args.steps else []
        env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
        procs[tag] = subprocess.Popen(command, stdout=open(out / f"{tag}.log", "w"), stderr=subprocess.STDOUT, env=env)
    start = time.time()
    while any(p.poll() is None for p in procs.values()) and time.time() - start < args.deadline:
        time.sleep(2)
    results = {}
    for tag, proc in procs.items():
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        results[tag] = {"returncode": proc.returncode, **read_run(out / tag)}
        print(tag, results[tag], flush=True)
    print(f"wall {time.time() - start:.0f} s")
    for name in dict.fromkeys(name for name, _ in runs.values()):
        mine = [r["val"] for tag, r in results.items() if runs[tag][0] == name]
        for step in sorted({s for val in mine for s in val}):
            at = [val[step] for val in mine if step in val]
            print(f"{name}: step {step} median {statistics.median(at):.3f} ({min(at):.3f}-{max(at):.3f}), {len(at)} runs")
    (out / "sweep.json").write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
