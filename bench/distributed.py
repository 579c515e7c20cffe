"""Step time and peak memory of the same `rlvr train` job run different ways: in one process
(the default), FSDP2 in one process (world size 1), FSDP2 with parameter and optimizer offload
(GPU), and 2 Ray CPU workers (FSDP2 over gloo, inside a loopback-only network namespace).

    python bench/distributed.py --modes local,ray2 --steps 4            # CPU: one process vs 2 workers
    python bench/distributed.py --modes local,fsdp2,fsdp2_offload --device cuda --steps 8

Each mode is a fresh `rlvr train` of the built-in default job (GRPO, 8 prompts x 8 samples,
64-token responses) for ``--steps`` steps with no validation or checkpoints; the step time is
the median of steps 2.. (the first compiles and warms caches), the memory the peak of rank 0's
process (CPU RSS; on a GPU, also torch's max allocated). Ratios are against the first mode.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from runs import at_least, comma_list, fresh_run_dir, one_of

ROOT = Path(__file__).resolve().parents[1]
MODES = {
    "local": [],
    "fsdp2": ["actor_rollout_ref.actor.strategy=fsdp2"],
    "fsdp2_offload": ["actor_rollout_ref.actor.strategy=fsdp2", "actor_rollout_ref.actor.fsdp_config.param_offload=true",
                      "actor_rollout_ref.actor.fsdp_config.optimizer_offload=true",
                      "actor_rollout_ref.ref.fsdp_config.param_offload=true"],
    "ray2": ["actor_rollout_ref.actor.strategy=fsdp2", "trainer.n_gpus_per_node=2"],
}


def run(mode: str, steps: int, device: str, extra: list[str], out: Path) -> dict:
    run_dir = fresh_run_dir(out / mode)
    command = [sys.executable, "-m", "rlvr.cli", "train", *MODES[mode], f"trainer.device={device}",
               f"trainer.total_training_steps={steps}", "trainer.test_freq=-1", "trainer.save_freq=-1",
               "trainer.val_before_train=false", "trainer.logger=[jsonl]", f"trainer.default_local_dir={run_dir}",
               "trainer.resume_mode=disable", *extra]
    if mode.startswith("ray"):
        sys.path.insert(0, str(ROOT / "tests"))
        from loopback_only import loopback_only
        command = loopback_only(command)
    done = subprocess.run(command, capture_output=True, text=True, cwd=ROOT)
    if done.returncode:
        raise SystemExit(f"{mode} failed:\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}")
    records = [json.loads(line) for line in open(run_dir / "metrics.jsonl") if '"step"' in line]
    train = [r for r in records if r.get("step", 0) >= 2 and "timing_s/step" in r]
    return {"step_s": statistics.median(r["timing_s/step"] for r in train),
            "gen_s": statistics.median(r["timing_s/gen"] for r in train),
            "update_s": statistics.median(r["timing_s/update_actor"] for r in train),
            "rss_gb": max(r.get("perf/cpu_max_rss_gb", 0) for r in records),
            "gpu_gb": max(r.get("perf/max_memory_allocated_gb", 0) for r in records),
            "reward": statistics.mean(r["critic/score/mean"] for r in records if "critic/score/mean" in r)}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--modes", type=comma_list(one_of(*MODES)), default="local,ray2")
    parser.add_argument("--steps", type=at_least(2), default=4, help="at least 2: the first step is left out")
    parser.add_argument("--device", choices=("auto", "cpu", "cuda"), default="cpu")
    parser.add_argument("overrides", nargs="*", help="extra key=value overrides for every mode")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    modes = args.modes
    with tempfile.TemporaryDirectory() as tmp:
        results = {mode: run(mode, args.steps, args.device, args.overrides, Path(tmp)) for mode in modes}
    base = results[modes[0]]
    print(f"{'mode':<15}{'step s':>9}{'gen s':>9}{'update s':>10}{'RSS GB':>9}{'GPU GB':>9}{'reward':>8}"
          f"{'step vs ' + modes[0]:>18}")
    for mode, r in results.items():
        print(f"{mode:<15}{r['step_s']:>9.2f}{r['gen_s']:>9.2f}{r['update_s']:>10.2f}{r['rss_gb']:>9.2f}"
              f"{r['gpu_gb']:>9.2f}{r['reward']:>8.3f}{r['step_s'] / base['step_s']:>17.2f}x")


if __name__ == "__main__":
    main()
