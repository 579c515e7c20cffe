"""TRL #7274 (https://github.com/huggingface/trl/issues/7274): with dynamic sampling, a step that
drops groups without signal draws further prompts to refill its batch, so after k steps the data
stream has moved by more than k batches. A resume that puts the cursor back at k batches trains
prompts again that were already drawn (and its later steps differ from the uninterrupted run's),
silently.

Here DAPO's filter (``algorithm.filter_groups``) drops every prompt with an even answer (always
"right": no spread); the run saves after step 1 and is stopped as step 2 starts. The resumed run
must continue from the cursor after every batch step 1 drew, and train step 2 as the
uninterrupted run does: the same prompts, samples, scores, metrics and weights.
"""

import json

import pytest
import torch

from rlvr.errors import TrainingInterrupted
from rlvr.trainer.main import build_trainer
from tests.trainer.conftest import interrupt_at
from tests.trainer.test_checkpoint import full_run, records, stable, weights
from tests.trainer.test_trainer import DAPO_REWARD


def dumped(run_dir, step):
    return [json.loads(line) for line in open(run_dir / "rollouts" / f"{step}.jsonl")]


def test_a_resume_after_dynamic_sampling_drew_more_prompts_continues_the_stream(tiny_config, tmp_path):
    """Fails when load_checkpoint's sampler restore is replaced by a cursor counted in steps
    (global_step x data.gen_batch_size prompts) instead of the batches the steps drew."""
    reward = tmp_path / "dapo_reward.py"
    reward.write_text(DAPO_REWARD)
    dapo = ("algorithm.filter_groups.enable=true", "algorithm.filter_groups.metric=acc", "data.gen_batch_size=2",
            "trainer.total_training_steps=2", "trainer.save_freq=1", "data.val_files=[]",
            "actor_rollout_ref.actor.ppo_mini_batch_size=2", "data.max_response_length=4",
            f"reward.custom_reward_function.path={reward}")
    _, reference = full_run(tiny_config, tmp_path / "ref", *dapo)
    expected = records(tmp_path / "ref")
    drawn = int(expected[0]["dapo/num_gen_batches"])  # batches of 2 prompts step 1 drew
    assert drawn >= 2 and expected[0]["dapo/filtered_groups"] >= 1  # it dropped a group and drew more

    config = tiny_config(*dapo, "trainer.val_before_train=false", f"trainer.default_local_dir={tmp_path / 'cut'}")
    cut = build_trainer(config, progress_bar=False)
    interrupt_at(cut, cut, "train_step", 2)  # Ctrl-C as step 2 starts
    with pytest.raises(TrainingInterrupted, match="interrupted after step 1; step 1 was already saved"):
        cut.fit()
    cut.tracker.close()
    resumed = build_trainer(config, progress_bar=False)
    # the cursor is 2 prompts past each batch step 1 drew (a cursor counted in steps: 1 x 2 = 2)
    assert resumed.global_step == 1 and resumed.loader.state_dict()["offset"] == 2 * drawn
    resumed.fit()
    resumed.tracker.close()

    assert dumped(tmp_path / "cut", 2) == dumped(tmp_path / "ref", 2)  # prompts, samples, scores, advantages
    assert [stable(r) for r in records(tmp_path / "cut")] == [stable(r) for r in expected]
    assert resumed.loader.state_dict() == reference.loader.state_dict()
    assert all(torch.equal(a, b) for a, b in zip(weights(resumed), weights(reference)))
