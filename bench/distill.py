"""On-policy distillation on the built-in task, against GRPO from the same start.

    python bench/distill.py [--teacher DIR] [--steps 24] [--device cpu|cuda] [--out DIR] [--runs grpo,distill,distill_term]
                            [key=value ...]

- ``grpo``: the default job (``rlvr train``: GRPO from the untrained built-in model), validated every
  6 steps; its step-24 checkpoint is the teacher unless ``--teacher`` names one.
- ``distill``: ``rlvr train --config distill`` from the same untrained model and seeds: the
  teacher's top-32 forward KL on the student's own samples, added to GRPO's loss on the task
  reward, 16 prompts x 8 a step in two optimizer steps.
- ``distill_term``: the same with the teacher's term alone
  (``distillation.distillation_loss.use_task_rewards=false``).

Each run validates at steps 0, 6, 12, 18 and 24 (greedy accuracy on the 300 held-out problems,
mean@1) and reports its wall time and median step. The issue's goal: the student reaches the
teacher's accuracy within 12 steps (GRPO: about 0.50 at step 12).

``key=value`` overrides apply to every run. An override of a key this script sets itself is
refused, naming the flag that sets it: it would be overridden silently otherwise. The keys with
no flag (validation and save frequencies, the run folder's resume mode and logger) are refused
too: the comparison depends on them.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from runs import at_least, comma_list, fresh_run_dir, one_of, override_key, rlvr_train

RUNS = ("grpo", "distill", "distill_term")
# Keys this script (or runs.rlvr_train) sets in the runs -> what to use instead of an override of one.
SET_HERE = {
    "trainer.device": "--device",
    "trainer.total_training_steps": "--steps",
    "distillation.teacher_models.teacher_model.model_path": "--teacher",
    "distillation.distillation_loss.use_task_rewards": "--runs distill_term",
    "trainer.default_local_dir": "--out",
    "trainer.test_freq": "no flag: every run validates every 6 steps, the table's columns",
    "trainer.save_freq": "no flag: the grpo run saves its last step, the teacher",
    "trainer.resume_mode": "no flag: every run starts afresh in its own folder",
    "trainer.logger": "no flag: the runs' metrics.jsonl is read back",
}


def run(name: str, out: Path, steps: int, device: str, *overrides: str) -> dict:
    done = rlvr_train([*overrides, f"trainer.device={device}", f"trainer.total_training_steps={steps}",
                       "trainer.test_freq=6"], out / name, out / f"{name}.log")
    timed = [r for r in done["records"] if "timing_s/step" in r]
    step_times = [r["timing_s/step"] for r in timed if r["step"] >= 2] or [r["timing_s/step"] for r in timed]
    result = {"run": name, "wall_s": done["wall_s"], "accuracy": done["accuracy"],
              "median_step_s": statistics.median(step_times)}
    print(json.dumps(result), flush=True)
    return result


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--teacher", help="the teacher's folder (default: the grpo run's last checkpoint)")
    parser.add_argument("--steps", type=at_least(1), default=24)
    parser.add_argument("--device", choices=("auto", "cpu", "cuda"), default="cpu")
    parser.add_argument("--runs", type=comma_list(one_of(*RUNS)), default=",".join(RUNS))
    parser.add_argument("--out", default="bench_out/distill")
    parser.add_argument("overrides", nargs="*", help="key=value for every run (a smaller model or data to try it)")
    args = parser.parse_args(argv)
    for key in map(override_key, args.overrides):
        if key in SET_HERE:
            parser.error(f"this script sets {key} itself ({SET_HERE[key]})")
    if args.teacher and not {"distill", "distill_term"} & set(args.runs):
        parser.error("--teacher is read by the distill runs only: --runs has none")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    # grpo also runs unasked when no --teacher is given: its last checkpoint is the teacher
    runs = [name for name in RUNS if name in args.runs or (name == "grpo" and args.teacher is None)]
    for name in runs:  # an earlier run's folder is refused now, not after the runs before it
        fresh_run_dir(out / name)
    results = []
    teacher = args.teacher
    if "grpo" in runs:
        results.append(run("grpo", out, args.steps, args.device, f"trainer.save_freq={args.steps}", *args.overrides))
        teacher = teacher or str(out / "grpo" / "checkpoints" / f"global_step_{args.steps}" / "actor")
    common = ("--config", "distill", f"distillation.teacher_models.teacher_model.model_path={teacher}", "trainer.save_freq=-1",
              *args.overrides)
    if "distill" in runs:
        results.append(run("distill", out, args.steps, args.device, *common))
    if "distill_term" in runs:
        results.append(run("distill_term", out, args.steps, args.device, *common,
                           "distillation.distillation_loss.use_task_rewards=false"))
    (out / "distill.json").write_text(json.dumps(results, indent=1))
    steps = sorted({s for r in results for s in r["accuracy"]})
    print("\n| run | " + " | ".join(f"step {s}" for s in steps) + " | wall time | median step |")
    print("|---|" + "---|" * (len(steps) + 2))
    for r in results:
        cells = [f"{r['accuracy'][s]:.3f}" if s in r["accuracy"] else "" for s in steps]
        print(f"| {r['run']} | " + " | ".join(cells) + f" | {r['wall_s'] / 60:.1f} min | {r['median_step_s']:.2f} s |")


if __name__ == "__main__":
    main()
