"""The default job's step in the synchronous and the async trainer modes, in one process.

    .venv/bin/python bench/async.py [--steps 4] [--modes sync,1,2] [overrides ...]

Modes: ``sync`` (the hybrid engine), and k = 0, 1, 2, ... for ``trainer.v1.trainer_mode=
colocate_async`` with ``num_warmup_batches=k`` (1: one-step-off); ``pool-sync`` and ``pool-k``
put the rollout on a Ray pool of 2 CPU workers of its own (``hybrid_engine=false``, synchronous
or ``separate_async``), the weights broadcast to it (``timing_s/sync_weights``,
``update_weights``). Each mode trains the default
job (built-in model, arithmetic, 8 prompts x n=8) for ``--steps`` steps without validation;
the first step (nothing generated ahead yet, caches cold) is left out. Prints, per mode, the
median over the other steps of: seconds per step, the trainer's wait for generation
(``wait_gen``), the engine's generation and weight-load times (in its thread, overlapping the
update), the update, both idle ratios, and the step time as a ratio of the synchronous one. With
``trainer.device=cuda``, also each mode's peak of ``torch.cuda.max_memory_allocated`` (the
whole process: actor, reference and the engine ahead; what earlier modes left is not counted)
next to the memory plan's peak for the same config.
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

from runs import at_least, comma_list

COLUMNS = ("timing_s/step", "timing_s/wait_gen", "timing_s/gen", "timing_s/update_weights", "timing_s/sync_weights",
           "timing_s/update_actor",
           "perf/trainer_idle_ratio", "perf/rollout_idle_ratio")


def mode_name(text: str) -> str:
    """An argparse type: ``sync``, ``k`` (steps generated ahead) or ``pool-sync`` / ``pool-k``."""
    ahead = text.removeprefix("pool-")
    if ahead != "sync" and not ahead.isdigit():
        raise argparse.ArgumentTypeError(f"{text!r} is not a mode: sync, k (0, 1, 2, ...), pool-sync or pool-k")
    return text


def run_mode(mode: str, steps: int, overrides: list[str]) -> dict[str, float]:
    if mode.startswith("pool"):
        return run_on_a_pool(mode, steps, overrides)
    from rlvr.config import load_config  # here, not at the top: importing this file to check its arguments stays quick
    from rlvr.trainer.main import build_trainer

    extra = [] if mode == "sync" else ["trainer.v1.trainer_mode=colocate_async",
                                       f"trainer.v1.colocate_async.num_warmup_batches={int(mode)}"]
    cuda = torch.cuda.is_available()
    if cuda:  # this mode's peak alone: what earlier modes left is collected and not counted
        gc.collect()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
    with tempfile.TemporaryDirectory() as run_dir:
        config = load_config(None, [f"trainer.total_training_steps={steps}", "trainer.val_before_train=false",
                                    "trainer.test_freq=-1", "trainer.save_freq=-1", "trainer.logger=[]",
                                    "trainer.rollout_data_dir=null",
                                    f"trainer.default_local_dir={run_dir}", *extra, *overrides])
        trainer = build_trainer(config, progress_bar=False)
        per_step = []
        log = trainer.tracker.log

        def recording(metrics, step):
            if step > 1:
                per_step.append(metrics)
            log(metrics, step=step)
        trainer.tracker.log = recording
        trainer.fit()
        trainer.tracker.close()
    row = {key: statistics.median(m.get(key, 0.0) for m in per_step) for key in COLUMNS}
    if cuda and config.trainer.device == "cuda":  # the process's peak: actor, reference and the engine ahead
        from rlvr.trainer.memory_plan import plan_memory, read_model_config

        plan = plan_memory(config, read_model_config(config.actor_rollout_ref.model.path))
        row["peak_gib"] = (torch.cuda.max_memory_allocated() - base) / 2**30
        row["plan_gib"] = plan.peak / 2**30
        print(f"{mode}: peak allocated {row['peak_gib']:.2f} GiB, plan {row['plan_gib']:.2f} GiB "
              f"({plan.peak_phase})", flush=True)
    return row


def run_on_a_pool(mode: str, steps: int, overrides: list[str]) -> dict[str, float]:
    """``pool-sync`` / ``pool-k``: the rollout on a Ray pool of 2 CPU workers of its own
    (``hybrid_engine=false``; ``separate_async`` with k ahead), the weights broadcast to it; an
    ``rlvr train`` process in a loopback-only network namespace (Ray listens on every interface)."""
    sys.path.insert(0, str(Path(__file__).parents[1] / "tests"))
    from loopback_only import loopback_only

    ahead = mode.split("-", 1)[1]
    extra = [] if ahead == "sync" else ["trainer.v1.trainer_mode=separate_async",
                                        f"trainer.v1.colocate_async.num_warmup_batches={int(ahead)}"]
    with tempfile.TemporaryDirectory() as run_dir:
        command = [sys.executable, "-m", "rlvr.cli", "train", f"trainer.total_training_steps={steps}",
                   "trainer.val_before_train=false", "trainer.test_freq=-1", "trainer.save_freq=-1",
                   "trainer.logger=[jsonl]", "trainer.rollout_data_dir=null", f"trainer.default_local_dir={run_dir}",
                   "trainer.device=cpu", "actor_rollout_ref.hybrid_engine=false",
                   "actor_rollout_ref.rollout.n_gpus_per_node=2", "ray_kwargs.ray_init.num_cpus=3", *extra, *overrides]
        done = subprocess.run(loopback_only(command), capture_output=True, text=True)
        if done.returncode:
            raise SystemExit(f"{mode} failed:\n{done.stdout[-2000:]}{done.stderr[-2000:]}")
        per_step = [json.loads(line) for line in open(Path(run_dir) / "metrics.jsonl")]
    per_step = [m for m in per_step if m.get("step", 0) > 1]
    return {key: statistics.median(m.get(key, 0.0) for m in per_step) for key in COLUMNS}


def parse_args(argv: list[str] | None = None) -> tuple[argparse.Namespace, list[str]]:
    """(the flags, the key=value overrides for every mode); any other argument is refused."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=at_least(2), default=4, help="at least 2: the first step is left out")
    parser.add_argument("--modes", type=comma_list(mode_name), default="sync,1,2")
    args, overrides = parser.parse_known_args(argv)
    unknown = [arg for arg in overrides if arg.startswith("-") or not (arg.startswith("~") or "=" in arg)]
    if unknown:
        parser.error(f"unrecognized arguments: {' '.join(unknown)} (overrides are key=value)")
    return args, overrides


def main(argv: list[str] | None = None) -> None:
    args, overrides = parse_args(argv)
    results = {mode: run_mode(mode, args.steps, overrides) for mode in args.modes}
    sync = results.get("sync", {}).get("timing_s/step")
    print(f"median of steps 2-{args.steps} (seconds unless a ratio)")
    print(f"{'mode':<10}" + "".join(f"{c.split('/')[-1]:>19}" for c in COLUMNS) + f"{'vs sync':>10}")
    for mode, row in results.items():
        name = mode if not mode[0].isdigit() else f"ahead={mode}"
        ratio = f"{row['timing_s/step'] / sync:>10.2f}" if sync else ""
        print(f"{name:<10}" + "".join(f"{row[c]:>19.2f}" for c in COLUMNS) + ratio)
        if "peak_gib" in row:
            print(f"{'':<10}peak allocated {row['peak_gib']:.2f} GiB, memory plan {row['plan_gib']:.2f} GiB")


if __name__ == "__main__":
    main()
