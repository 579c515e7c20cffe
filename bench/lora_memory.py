"""Memory of the default GRPO job with full fine-tuning and with LoRA (built-in model).

    .venv/bin/python bench/lora_memory.py [--rank 16] [--steps 2]

Each mode runs in its own process (``--steps`` steps of the default recipe with the KL loss,
so a reference policy is needed) and reports:

- the peak resident memory of the process (``ru_maxrss``);
- the bytes held by what LoRA removes: the reference policy's copy of the weights, the
  gradients and the AdamW state of the trained parameters.

Full fine-tuning keeps a frozen copy of the weights as the reference and AdamW state for every
weight; with LoRA the reference is the same model with the adapter disabled and only the
adapter's parameters have gradients and optimizer state.
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import tempfile
from pathlib import Path

from runs import at_least, run_child

MB = 1024 ** 2


def tensor_bytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def run_mode(rank: int, steps: int) -> dict:
    from rlvr.config import load_config
    from rlvr.data.prepare import prepare_arithmetic
    from rlvr.trainer.main import build_trainer

    tmp = Path(tempfile.mkdtemp())
    data = prepare_arithmetic(tmp / "data", train_size=64, test_size=8)
    overrides = [f"data.train_files=[{data['train']}]", "data.val_files=[]", f"trainer.total_training_steps={steps}",
                 "trainer.val_before_train=false", "trainer.logger=[jsonl]", f"trainer.default_local_dir={tmp / 'run'}",
                 "trainer.save_freq=-1", "trainer.rollout_data_dir=null"]
    if rank:
        overrides += [f"actor_rollout_ref.model.lora_rank={rank}", f"actor_rollout_ref.model.lora_alpha={2 * rank}",
                      "actor_rollout_ref.actor.optim.lr=1e-4"]
    trainer = build_trainer(load_config(None, overrides), progress_bar=False)
    trainer.fit()
    trainer.tracker.close()
    worker = trainer.wg.worker
    optimizer = worker.actor.optimizer
    trained = [p for group in optimizer.param_groups for p in group["params"]]
    state = [t for s in optimizer.state.values() for t in s.values() if hasattr(t, "numel")]
    return {"peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            "weights_mb": tensor_bytes(worker.model.parameters()) / MB,
            "reference_copy_mb": tensor_bytes(worker.ref.model.parameters()) / MB if worker.ref is not None else 0.0,
            "trained_parameters": sum(p.numel() for p in trained),
            "gradients_mb": tensor_bytes(trained) / MB,
            "optimizer_state_mb": tensor_bytes(state) / MB}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rank", type=at_least(1), default=16)
    parser.add_argument("--steps", type=at_least(1), default=2)
    parser.add_argument("--mode", type=int, default=None, help=argparse.SUPPRESS)  # the child process
    args = parser.parse_args()
    if args.mode is not None:
        print(json.dumps(run_mode(args.mode, args.steps)))
        return
    results = {}
    for name, rank in (("full fine-tuning", 0), (f"LoRA rank {args.rank}", args.rank)):
        out = run_child([sys.executable, __file__, "--mode", str(rank), "--steps", str(args.steps)], name)
        results[name] = json.loads(out.strip().splitlines()[-1])
    keys = ("peak_rss_mb", "weights_mb", "reference_copy_mb", "gradients_mb", "optimizer_state_mb", "trained_parameters")
    print(f"{'':<20}" + "".join(f"{k:>20}" for k in keys))
    for name, r in results.items():
        print(f"{name:<20}" + "".join(f"{r[k]:>20,.0f}" for k in keys))
    full, lora = results.values()
    print(f"LoRA saves {full['peak_rss_mb'] - lora['peak_rss_mb']:,.0f} MB of peak memory "
          f"({lora['peak_rss_mb'] / full['peak_rss_mb']:.2f}x); reference copy + gradients + AdamW state: "
          f"{full['reference_copy_mb'] + full['gradients_mb'] + full['optimizer_state_mb']:,.0f} MB -> "
          f"{lora['reference_copy_mb'] + lora['gradients_mb'] + lora['optimizer_state_mb']:,.1f} MB")


if __name__ == "__main__":
    main()
