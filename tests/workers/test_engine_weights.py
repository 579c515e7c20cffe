"""The native engine on a sharded actor (``strategy=fsdp2``, one rank in this process) gathers
its unsharded weights once per weight version: consecutive rollouts with no update between
(validation batches, DAPO's extra batches, ReMax's greedy pass) reuse them, and what they
sample equals what freshly gathered weights sample."""

import numpy as np
import torch

from rlvr.config.loader import load_config
from rlvr.data import left_pad
from rlvr.protocol import DataProto
from rlvr.workers.hybrid import ActorRolloutRefWorker


def greedy_prompts(tokenizer) -> DataProto:
    questions = ["What is 2+3?", "What is 2+3?", "Say hi.", "Say hi."]  # 2 groups of n = 2
    ids = [tokenizer.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True,
                                         tokenize=True, return_dict=False) for q in questions]
    input_ids, mask, positions = left_pad(ids, tokenizer.pad_token_id)
    batch = DataProto.from_dict({"input_ids": input_ids, "attention_mask": mask, "position_ids": positions},
                                {"uid": np.array(["a", "a", "b", "b"], dtype=object)})
    batch.meta_info["do_sample"] = False
    return batch


def generate(worker, tokenizer) -> torch.Tensor:
    return worker.generate_sequences(greedy_prompts(tokenizer)).batch["responses"]


def update(worker, tokenizer) -> None:
    """One update with large random advantages (lr 0.1): enough to change the greedy tokens."""
    batch = worker.generate_sequences(greedy_prompts(tokenizer))
    batch = batch.union(worker.compute_log_prob(batch)).union(worker.compute_ref_log_prob(batch))
    g = torch.Generator().manual_seed(0)
    batch.batch["advantages"] = torch.randn(len(batch), 1, generator=g) * 10 * batch.batch["response_mask"]
    worker.update_actor(batch)


def test_the_engine_gathers_once_per_weight_version(tiny_model_dir):
    config = load_config(None, [f"actor_rollout_ref.model.path={tiny_model_dir}",
                                "actor_rollout_ref.actor.strategy=fsdp2", "actor_rollout_ref.rollout.dtype=float32",
                                "actor_rollout_ref.actor.optim.lr=0.1", "actor_rollout_ref.actor.ppo_mini_batch_size=2",
                                "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
                                "actor_rollout_ref.rollout.n=2", "data.train_batch_size=2",
                                "data.max_response_length=8", "trainer.device=cpu"])
    worker = ActorRolloutRefWorker(config, total_training_steps=2)
    worker.init_model()
    engine = worker.engine_weights
    tokenizer = worker.tokenizer

    first = generate(worker, tokenizer)
    again = generate(worker, tokenizer)  # no update between: the weights held are this version's
    assert engine.loads == 1 and torch.equal(again, first)
    worker.trainer_mode()  # the gathered weights freed: the next rollout gathers afresh
    assert torch.equal(generate(worker, tokenizer), again) and engine.loads == 2

    update(worker, tokenizer)  # its rollout reuses the held weights (3 - 1 = 2 gathers so far)
    assert engine.loads == 2 and engine.held_bytes == 0  # freed for the log-probs and the update
    after = generate(worker, tokenizer)
    assert engine.loads == 3  # a new version: gathered
    assert not torch.equal(after, first)  # the update changed the greedy tokens: stale weights would show
    worker.trainer_mode()
    assert torch.equal(generate(worker, tokenizer), after) and engine.loads == 4
