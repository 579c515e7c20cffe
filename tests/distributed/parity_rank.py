"""One rank of the FSDP2 parity runs (``test_fsdp_parity.py`` starts one process per rank, as
torchrun does, with RANK / WORLD_SIZE / MASTER_ADDR / MASTER_PORT in the environment).

``python parity_rank.py SPEC.json OUT_DIR``: build the hybrid worker from the spec's config
overrides, then for each step: generate this rank's prompt groups, compute log-probs (old and
reference) on this rank's share, gather the shares (with a worker group's collect), give
every row a fixed advantage and update the actor on the whole batch. Rank 0 writes the
generated tokens, log-probs, metrics and a checkpoint of the final weights to OUT_DIR. With
``resume_from`` the worker first loads that checkpoint (written by any number of ranks).
"""

import json
import os
import sys
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

from rlvr.config import load_config
from rlvr.distributed.dispatch import Dispatch, collect, dispatch
from rlvr.protocol import DataProto
from rlvr.workers.hybrid import ActorRolloutRefWorker

PROMPTS = ["What is 3 + 9?", "Compute 17 * 2.", "Say hi.", "Count to three.", "What is 5 - 8?", "Name a color.",
           "Add 10 and 11.", "Is 7 prime?"]


def prompt_batch(tokenizer, step: int, num_prompts: int, n: int) -> DataProto:
    from rlvr.data.dataset import left_pad

    texts = [PROMPTS[(step * num_prompts + i) % len(PROMPTS)] for i in range(num_prompts)]
    ids = [tokenizer.encode(tokenizer.apply_chat_template([{"role": "user", "content": t}], add_generation_prompt=True,
                                                          tokenize=False), add_special_tokens=False) for t in texts]
    rows = [ids[i // n] for i in range(num_prompts * n)]
    input_ids, mask, pos = left_pad(rows, tokenizer.pad_token_id)
    uids = np.array([f"s{step}p{i // n}" for i in range(len(rows))], dtype=object)
    batch = DataProto.from_dict({"input_ids": input_ids, "attention_mask": mask, "position_ids": pos}, {"uid": uids})
    batch.meta_info["seed"] = 1000 + step
    return batch


def gather(part: DataProto, widths: list | None = None) -> DataProto:
    """The ranks' answers joined in rank order by a worker group's collect; ``widths`` gets each
    rank's response width (ranks whose rows stop early answer narrower batches)."""
    parts = [part]
    if dist.is_initialized() and dist.get_world_size() > 1:
        parts = [None] * dist.get_world_size()
        dist.all_gather_object(parts, part)
    if widths is not None:
        widths.append([p.batch["responses"].shape[1] for p in parts])
    return collect(Dispatch.DP_COMPUTE_PROTO, parts)


def engine_facts(worker) -> dict:
    """The sharded engine's weights in a rollout after the updates: their dtype, bytes, version,
    and their largest difference from the actor's current weights (cast to the engine's dtype)."""
    from rlvr.distributed import fsdp

    actor = fsdp.full_model_state(worker.actor.root, worker.model)
    worker.rollout_mode()
    engine = worker.engine_weights
    params = dict(engine.model.named_parameters())
    facts = {"dtype": str(next(iter(params.values())).dtype), "bytes_in_rollout": engine.held_bytes,
             "loads": engine.loads, "engine_is_rollout_model": worker.rollout.model is engine.model}
    if worker.rank == 0:
        facts["max_diff"] = max(float((params[k].float() - v.to(params[k].dtype).float()).abs().max())
                                for k, v in actor.items())
    worker.trainer_mode()
    facts["bytes_after"] = engine.held_bytes
    return facts


def main(spec_path: str, out_dir: str) -> None:
    spec = json.loads(Path(spec_path).read_text())
    config = load_config(None, spec["overrides"])
    worker = ActorRolloutRefWorker(config, total_training_steps=spec["steps"] + spec.get("first_step", 0))
    worker.init_model()
    engine_bytes_at_init = worker.engine_weights.held_bytes if worker.engine_weights is not None else None
    if spec.get("resume_from"):
        worker.load_checkpoint(spec["resume_from"])
    world, rank = worker.world_size, worker.rank
    n = config.actor_rollout_ref.rollout.n
    record = {"responses": [], "old_log_probs": [], "ref_log_prob": [], "teacher_log_prob": [],
              "teacher_topk_log_probs": [], "metrics": [], "rank_widths": [],
              "engine_bytes_at_init": engine_bytes_at_init}
    for step in range(spec.get("first_step", 0), spec.get("first_step", 0) + spec["steps"]):
        prompts = prompt_batch(worker.tokenizer, step, config.data.train_batch_size, n)
        (mine,), _ = dispatch(Dispatch.DP_COMPUTE_PROTO, world, (prompts,), {})[rank]
        batch = gather(worker.generate_sequences(mine), record["rank_widths"])
        batch.non_tensor_batch["uid"] = prompts.non_tensor_batch["uid"]  # as the trainer unions them back
        (mine,), _ = dispatch(Dispatch.DP_COMPUTE_PROTO, world, (batch,), {})[rank]
        batch = batch.union(gather(worker.compute_log_prob(mine)))
        if config.actor_rollout_ref.actor.use_kl_loss:
            batch = batch.union(gather(worker.compute_ref_log_prob(mine)))
        if config.distillation.enabled:  # the sharded teacher: each rank scores its own rows
            batch = batch.union(gather(worker.compute_teacher_log_prob(mine)))
        g = torch.Generator().manual_seed(step)
        advantages = torch.randn(len(batch), generator=g)[:, None] * batch.batch["response_mask"]
        batch.batch["advantages"] = advantages
        modes = spec.get("loss_agg_modes")
        if modes:  # one aggregation mode per step, in turn
            worker.actor.config.loss_agg_mode = modes[(step - spec.get("first_step", 0)) % len(modes)]
        out = worker.update_actor(batch)
        for key in ("responses", "old_log_probs", "ref_log_prob", "teacher_log_prob", "teacher_topk_log_probs"):
            if key in batch.batch:
                record[key].append(batch.batch[key])
        record["metrics"].append(out.meta_info["metrics"])
        if worker.engine_weights is not None:  # released for the update
            record.setdefault("engine_bytes_in_update", []).append(worker.engine_weights.held_bytes)
    if worker.engine_weights is not None:
        record["engine"] = engine_facts(worker)
    if config.actor_rollout_ref.rollout.name == "vllm":  # the ranks one engine spans, and its share of a layer
        from vllm.distributed import get_tensor_model_parallel_world_size

        runner = worker.rollout.engine.runner
        record["vllm_tp"] = get_tensor_model_parallel_world_size()
        record["vllm_qkv_rows"] = runner.model.model.layers[0].self_attn.qkv_proj.weight.shape[0]
    worker.save_checkpoint(Path(out_dir) / "checkpoint")
    if rank == 0:
        torch.save(record, Path(out_dir) / "record.pt")
    if dist.is_initialized():
        dist.destroy_process_group()


if __name__ == "__main__":
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    main(sys.argv[1], sys.argv[2])
