"""On-policy distillation on the built-in task, against GRPO from the same start.

    python bench/distill.py [--teacher DIR] [--steps 24] [--device cpu|cuda] [--out DIR] [--runs grpo,distill,distill_task]
                            [key=value ...]

- ``grpo``: the default job (``rlvr train``: GRPO from the untrained built-in model), validated every
  6 steps; its step-24 checkpoint is the teacher unless ``--teacher`` names one.
- ``distill``: ``rlvr train --config distill`` from the same untrained model and seeds: the
  teacher's top-32 forward KL on the student's own samples, alone.
- ``distill_task``: the same term added to GRPO's loss on the task reward
  (``distillation.distillation_loss.use_task_rewards=true``).

Each run validates at steps 0, 6, 12, 18 and 24 (greedy accuracy on the 300 held-out problems,
mean@1) and reports its wall time and median step. The issue's goal: the student reaches the
teacher's accuracy within 12 steps (GRPO: about 0.50 at step 12).
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from runs import rlvr_train


def run(name: str, out: Path, steps: int, device: str, *overrides: str) -> dict:
    done = rlvr_train([*overrides, f"trainer.device={device}", f"trainer.total_training_steps={steps}",
                       "trainer.test_freq=6"], out / name, out / f"{name}.log")
    timed = [r for r in done["records"] if "timing_s/step" in r]
    step_times = [r["timing_s/step"] for r in timed if r["step"] >= 2] or [r["timing_s/step"] for r in timed]
    result = {"run": name, "wall_s": done["wall_s"], "accuracy": done["accuracy"],
              "median_step_s": statistics.median(step_times)}
    print(json.dumps(result), flush=True)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--teacher", help="the teacher's folder (default: the grpo run's step-24 checkpoint)")
    parser.add_argument("--steps", type=int, default=24)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--runs", default="grpo,distill,distill_task")
    parser.add_argument("--out", default="bench_out/distill")
    parser.add_argument("overrides", nargs="*", help="key=value for every run (a smaller model or data to try it)")
    args = parser.parse_args()
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    runs = args.runs.split(",")
    results = []
    teacher = args.teacher
    if "grpo" in runs or teacher is None:
        results.append(run("grpo", out, args.steps, args.device, f"trainer.save_freq={args.steps}", *args.overrides))
        teacher = teacher or str(out / "grpo" / "checkpoints" / f"global_step_{args.steps}" / "actor")
    common = ("--config", "distill", f"distillation.teacher_models.teacher_model.model_path={teacher}", "trainer.save_freq=-1",
              *args.overrides)
    if "distill" in runs:
        results.append(run("distill", out, args.steps, args.device, *common))
    if "distill_task" in runs:
        results.append(run("distill_task", out, args.steps, args.device, *common,
                           "distillation.distillation_loss.use_task_rewards=true"))
    (out / "distill.json").write_text(json.dumps(results, indent=1))
    steps = sorted({s for r in results for s in r["accuracy"]})
    print("\n| run | " + " | ".join(f"step {s}" for s in steps) + " | wall time | median step |")
    print("|---|" + "---|" * (len(steps) + 2))
    for r in results:
        cells = [f"{r['accuracy'][s]:.3f}" if s in r["accuracy"] else "" for s in steps]
        print(f"| {r['run']} | " + " | ".join(cells) + f" | {r['wall_s'] / 60:.1f} min | {r['median_step_s']:.2f} s |")


if __name__ == "__main__":
    main()
