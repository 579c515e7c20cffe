"""The default job's step in the synchronous and the async trainer modes, in one process.

    .venv/bin/python bench/async.py [--steps 4] [--modes sync,1,2] [overrides ...]

Modes: ``sync`` (the hybrid engine), and k = 0, 1, 2, ... for ``trainer.v1.trainer_mode=
colocate_async`` with ``num_warmup_batches=k`` (1: one-step-off). Each mode trains the default
job (built-in model, arithmetic, 8 prompts x n=4) for ``--steps`` steps without validation;
the first step (nothing generated ahead yet, caches cold) is left out. Prints, per mode, the
median over the other steps of: seconds per step, the trainer's wait for generation
(``wait_gen``), the engine's generation and weight-load times (in its thread, overlapping the
update), the update, both idle ratios, and the step time as a ratio of the synchronous one.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile

from rlvr.config import load_config
from rlvr.trainer.main import build_trainer

COLUMNS = ("timing_s/step", "timing_s/wait_gen", "timing_s/gen", "timing_s/update_weights", "timing_s/update_actor",
           "perf/trainer_idle_ratio", "perf/rollout_idle_ratio")


def run_mode(mode: str, steps: int, overrides: list[str]) -> dict[str, float]:
    extra = [] if mode == "sync" else ["trainer.v1.trainer_mode=colocate_async",
                                       f"trainer.v1.colocate_async.num_warmup_batches={int(mode)}"]
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
    return {key: statistics.median(m.get(key, 0.0) for m in per_step) for key in COLUMNS}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--modes", default="sync,1,2")
    args, overrides = parser.parse_known_args()
    results = {mode: run_mode(mode, args.steps, overrides) for mode in args.modes.split(",")}
    sync = results.get("sync", {}).get("timing_s/step")
    print(f"median of steps 2-{args.steps} (seconds unless a ratio)")
    print(f"{'mode':<10}" + "".join(f"{c.split('/')[-1]:>19}" for c in COLUMNS) + f"{'vs sync':>10}")
    for mode, row in results.items():
        name = "sync" if mode == "sync" else f"ahead={mode}"
        ratio = f"{row['timing_s/step'] / sync:>10.2f}" if sync else ""
        print(f"{name:<10}" + "".join(f"{row[c]:>19.2f}" for c in COLUMNS) + ratio)


if __name__ == "__main__":
    main()
