"""Per-rank peak memory of FSDP2 at world size 1, 2 and 4, next to the memory plan's prediction.

    .venv/bin/python bench/memory.py [--worlds 1,2,4] [--layers 28] [--hidden 1024]

A synthetic Llama (random weights from a config, the built-in tokenizer; 28 layers of width
1024: 0.31B parameters, 1.26 GB in fp32) is written once; then, for each world size, that
many ranks (processes rendezvousing on 127.0.0.1 over gloo, as torchrun starts them) run
the hybrid worker through two GRPO steps: generate their rows, old and reference log-probs,
one update on the whole batch. Each rank resets its peak resident set (``VmHWM``, through
``/proc/self/clear_refs``) before each phase and reads it after: init (``init_model``),
generation and update of the second step (the optimizer state exists by then). A figure is
the peak minus the rank's resident set before ``init_model`` (Python, torch, transformers, the
tokenizer and the model classes' imports),
the largest over the ranks; the plan (``rlvr plan``) predicts the same quantity for the
same config. Rows per rank stay fixed (2 prompts x 2 samples, 32-token responses), so the
model state dominates and should fall as 1/N, plus the rollout's unsharded weights.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from runs import at_least, comma_list

GB = 1e9


def rss_bytes(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"/proc/self/status has no {field}")


def reset_peak() -> None:
    Path("/proc/self/clear_refs").write_text("5")  # VmHWM := VmRSS (Linux >= 4.0)


def overrides(model_dir: str, world: int) -> list[str]:
    return [f"actor_rollout_ref.model.path={model_dir}", "trainer.device=cpu", f"trainer.n_gpus_per_node={world}",
            "actor_rollout_ref.actor.strategy=fsdp2", f"data.train_batch_size={2 * world}",
            "actor_rollout_ref.rollout.n=2", "data.max_prompt_length=64", "data.max_response_length=32",
            f"actor_rollout_ref.actor.ppo_mini_batch_size={2 * world}",
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1",
            "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=1",
            "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=1",
            "actor_rollout_ref.actor.use_kl_loss=true", "trainer.total_training_steps=2"]


def rank_main(model_dir: str, world: int, out: str) -> None:
    import numpy as np
    import torch
    import torch.distributed as dist

    from rlvr.config import load_config
    from rlvr.data.dataset import left_pad
    from rlvr.distributed.dispatch import Dispatch, collect, dispatch
    from rlvr.protocol import DataProto
    from rlvr.workers.hybrid import ActorRolloutRefWorker

    from rlvr.models.loader import empty_model, load_tokenizer

    config = load_config(None, overrides(model_dir, world))
    # the tokenizer and the model classes are loaded before the baseline: their lazy imports (tokenizer
    # back-ends, image and audio utilities when installed, as vLLM's dependencies are) are not model state
    worker = ActorRolloutRefWorker(config, total_training_steps=2, tokenizer=load_tokenizer(model_dir))
    empty_model(model_dir)
    base = rss_bytes("VmRSS")
    reset_peak()
    worker.init_model()
    peaks = {"init": rss_bytes("VmHWM") - base}
    rank, tok = worker.rank, worker.tokenizer

    def gather(part: DataProto) -> DataProto:
        parts = [None] * world
        dist.all_gather_object(parts, part)
        return collect(Dispatch.DP_COMPUTE_PROTO, parts)

    for step in range(2):
        texts = [f"Question {step}.{i}: what is {i} + {step * 7}? Answer with the number." for i in range(2 * world)]
        ids = [tok.encode(tok.apply_chat_template([{"role": "user", "content": t}], add_generation_prompt=True,
                                                  tokenize=False), add_special_tokens=False) for t in texts]
        rows = [ids[i // 2] for i in range(4 * world)]
        input_ids, mask, pos = left_pad(rows, tok.pad_token_id)
        uids = np.array([f"s{step}p{i // 2}" for i in range(len(rows))], dtype=object)
        prompts = DataProto.from_dict({"input_ids": input_ids, "attention_mask": mask, "position_ids": pos},
                                      {"uid": uids}, {"seed": step})
        (mine,), _ = dispatch(Dispatch.DP_COMPUTE_PROTO, world, (prompts,), {})[rank]
        reset_peak()
        generated = worker.generate_sequences(mine)
        peaks["generation"] = rss_bytes("VmHWM") - base
        batch = gather(generated)
        batch.non_tensor_batch["uid"] = uids
        reset_peak()
        (mine,), _ = dispatch(Dispatch.DP_COMPUTE_PROTO, world, (batch,), {})[rank]
        batch = batch.union(gather(worker.compute_log_prob(mine))).union(gather(worker.compute_ref_log_prob(mine)))
        batch.batch["advantages"] = torch.randn(len(batch))[:, None] * batch.batch["response_mask"]
        worker.update_actor(batch)
        peaks["update"] = rss_bytes("VmHWM") - base
    Path(out).write_text(json.dumps(peaks))
    dist.destroy_process_group()


def make_model(folder: Path, layers: int, hidden: int) -> None:
    from rlvr.models.loader import load_tokenizer
    from rlvr.models.tiny import make_tiny_model

    tokenizer = load_tokenizer("builtin")
    make_tiny_model(tokenizer, hidden_size=hidden, num_hidden_layers=layers).save_pretrained(folder)
    tokenizer.save_pretrained(folder)


def run_world(model_dir: Path, world: int, tmp: Path) -> dict:
    from rlvr.distributed.worker import free_port

    port, procs, outs = str(free_port()), [], []
    for rank in range(world):
        out = tmp / f"w{world}r{rank}.json"
        env = {**os.environ, "RANK": str(rank), "WORLD_SIZE": str(world), "LOCAL_RANK": str(rank),
               "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port, "GLOO_SOCKET_IFNAME": "lo",
               "OMP_NUM_THREADS": str(max(1, (os.cpu_count() or 1) // world))}
        procs.append(subprocess.Popen([sys.executable, __file__, "--rank", str(model_dir), str(world), str(out)],
                                      env=env))
        outs.append(out)
    try:
        codes = [p.wait(timeout=1800) for p in procs]
    finally:
        for p in procs:
            p.kill()
    if any(codes):
        raise SystemExit(f"world {world}: a rank failed (exit codes {codes})")
    return [json.loads(o.read_text()) for o in outs]


def main() -> None:
    if sys.argv[1:2] == ["--rank"]:
        return rank_main(*sys.argv[2:3], int(sys.argv[3]), sys.argv[4])
    parser = argparse.ArgumentParser()
    parser.add_argument("--worlds", type=comma_list(at_least(1)), default="1,2,4")
    parser.add_argument("--layers", type=at_least(1), default=28)
    parser.add_argument("--hidden", type=at_least(1), default=1024)
    parser.add_argument("--json", help="also write the figures here (per world: params, and per phase the ranks' "
                                       "measured bytes and the plan's)")
    args = parser.parse_args()

    from rlvr.config import load_config
    from rlvr.trainer.memory_plan import plan_memory, read_model_config

    with tempfile.TemporaryDirectory(prefix="rlvr-memory-") as tmp:
        tmp = Path(tmp)
        model_dir = tmp / "model"
        make_model(model_dir, args.layers, args.hidden)
        rows, figures = [], {}
        for world in args.worlds:
            plan = plan_memory(load_config(None, overrides(str(model_dir), world)), read_model_config(str(model_dir)))
            ranks = run_world(model_dir, world, tmp)
            figures[world] = {"params": plan.params, "full_fp32_bytes": 4 * plan.params,
                              **{phase: {"ranks": [r[phase] for r in ranks], "plan": plan.phase_bytes(phase)}
                                 for phase in ("init", "generation", "update")}}
            for phase in ("init", "generation", "update"):
                measured = max(r[phase] for r in ranks)
                predicted = plan.phase_bytes(phase)
                rows.append((world, phase, measured, predicted))
                print(f"world {world} {phase:<10} measured {measured / GB:6.2f} GB (ranks: "
                      f"{', '.join(f'{r[phase] / GB:.2f}' for r in ranks)})  plan {predicted / GB:6.2f} GB  "
                      f"plan/measured {predicted / measured:.2f}", flush=True)
        if args.json:
            Path(args.json).write_text(json.dumps(figures))
        print(f"\n{plan.params / 1e9:.2f}B parameters; per-rank peak above the process's start, largest rank")
        print("| world | phase | measured GB | plan GB | plan / measured |\n|---|---|---|---|---|")
        for world, phase, measured, predicted in rows:
            print(f"| {world} | {phase} | {measured / GB:.2f} | {predicted / GB:.2f} | {predicted / measured:.2f} |")


if __name__ == "__main__":
    main()
