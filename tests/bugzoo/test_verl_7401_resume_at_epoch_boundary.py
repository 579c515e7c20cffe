"""verl #7401 (https://github.com/verl-project/verl/issues/7401): a checkpoint saved exactly at an
epoch boundary holds a data loader whose epoch is used up. On resume verl moved to the next epoch
(``global_step // steps_per_epoch``) and restored that used-up position into it, so the new epoch
yielded no batch and the run exited with status 0 having trained none of its remaining steps.

Here 16 prompts in batches of 8 make 2 steps an epoch; 2 epochs are 4 steps; the run saves at
step 2 (the boundary) and is stopped as step 3 starts. The resumed run must train steps 3 and 4,
on epoch 1's 16 prompts, and move the weights away from the step-2 checkpoint's.
"""

import json
from pathlib import Path

import pytest
import torch

from rlvr.data import ResumableSampler
from rlvr.errors import TrainingInterrupted
from rlvr.models import load_model
from rlvr.trainer.main import build_trainer
from tests.trainer.conftest import interrupt_at


def dumped_prompts(run_dir: Path, step: int) -> list[str]:
    """The step's prompts in the order it trained them (one per group of n samples)."""
    rows = [json.loads(line) for line in open(run_dir / "rollouts" / f"{step}.jsonl")]
    return list(dict.fromkeys(row["prompt"] for row in rows))


def test_a_run_resumed_at_an_epoch_boundary_trains_the_next_epoch(tiny_config, tmp_path):
    """Fails when load_checkpoint's sampler restore is replaced by an epoch derived from global_step
    (verl's start_epoch) with the saved, used-up offset: the resumed run then skips epoch 1."""
    run_dir = tmp_path / "run"
    config = tiny_config("data.train_batch_size=8", "trainer.total_training_steps=null", "trainer.total_epochs=2",
                         "trainer.save_freq=2", "trainer.val_before_train=false", "trainer.test_freq=-1",
                         "data.max_response_length=4", "actor_rollout_ref.rollout.n=2",
                         "actor_rollout_ref.actor.ppo_mini_batch_size=8",
                         "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8",
                         f"trainer.default_local_dir={run_dir}")
    first = build_trainer(config, progress_bar=False)
    assert first.total_training_steps == 4  # 16 // 8 = 2 steps an epoch, 2 epochs
    interrupt_at(first, first, "train_step", 3)  # Ctrl-C as step 3 starts
    with pytest.raises(TrainingInterrupted, match="interrupted after step 2; step 2 was already saved"):
        first.fit()
    first.tracker.close()

    resumed = build_trainer(config, progress_bar=False)
    assert resumed.global_step == 2
    trained, train_step = [], resumed.train_step

    def recording(batch, more):
        trained.append(resumed.global_step)
        return train_step(batch, more)

    resumed.train_step = recording
    resumed.fit()
    resumed.tracker.close()

    assert trained == [3, 4]  # verl: [] (the restored epoch yielded nothing)
    records = [json.loads(line) for line in open(run_dir / "metrics.jsonl")]
    assert [(r["step"], r["training/epoch"]) for r in records] == [(1, 0.0), (2, 0.0), (3, 1.0), (4, 1.0)]
    # steps 3-4 trained epoch 1: its 16 prompts once each, in the order drawn from (data.seed, epoch 1)
    dataset = resumed.train_dataset
    epoch_1 = [resumed.tokenizer.decode(dataset[int(i)]["raw_prompt_ids"])
               for i in ResumableSampler(16, 8, seed=config.data.seed).epoch_order(1)]
    assert dumped_prompts(run_dir, 3) + dumped_prompts(run_dir, 4) == epoch_1 and len(set(epoch_1)) == 16
    at_step_2 = load_model(run_dir / "checkpoints" / "global_step_2" / "actor").parameters()
    assert not all(torch.equal(a, b) for a, b in zip(at_step_2, resumed.wg.worker.actor.model.parameters()))
