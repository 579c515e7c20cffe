"""A tiny, fast training setup: the tiny model, 16 arithmetic prompts, short responses, and a
reward that varies on random text (so advantages are not all zero)."""

import pytest

from rlvr.config import load_config
from rlvr.data.prepare import prepare_arithmetic

REWARD_FILE = '''
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    """1 for an even number of characters: varies across a tiny random model's samples."""
    return float(len(solution_str) % 2 == 0)
'''


@pytest.fixture(scope="session")
def tiny_data(tmp_path_factory):
    out = tmp_path_factory.mktemp("arith")
    return prepare_arithmetic(out, train_size=16, test_size=4)


@pytest.fixture
def tiny_config(tmp_path, tiny_model_dir, tiny_data):
    reward_file = tmp_path / "reward.py"
    reward_file.write_text(REWARD_FILE)

    def make(*overrides, custom_reward=True):
        base = [
            f"actor_rollout_ref.model.path={tiny_model_dir}",
            f"data.train_files=[{tiny_data['train']}]", f"data.val_files=[{tiny_data['test']}]",
            "data.train_batch_size=2", "data.max_response_length=8", "data.max_prompt_length=128",
            "actor_rollout_ref.rollout.n=3", "actor_rollout_ref.actor.ppo_mini_batch_size=1",
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=3",
            "actor_rollout_ref.actor.optim.lr=1e-3", "actor_rollout_ref.actor.optim.weight_decay=0.0",
            "trainer.total_training_steps=2", f"trainer.default_local_dir={tmp_path / 'run'}",
            "trainer.logger=[jsonl]",
        ]
        if custom_reward:
            base.append(f"reward.custom_reward_function.path={reward_file}")
        return load_config(None, base + list(overrides))

    return make


def interrupt_at(trainer, owner, name: str, step: int, call: int = 1) -> None:
    """Make ``owner.<name>`` raise KeyboardInterrupt on its ``call``-th call during training step
    ``step`` (earlier calls, and every other step, run the original)."""
    original, calls = getattr(owner, name), []

    def interrupting(*args, **kwargs):
        if trainer.global_step == step:
            calls.append(1)
            if len(calls) == call:
                raise KeyboardInterrupt
        return original(*args, **kwargs)

    setattr(owner, name, interrupting)


@pytest.fixture
def interrupt_and_resume():
    """``(trainer, at_step) -> resumed trainer``: Ctrl-C when step ``at_step`` starts (the
    ``TrainingInterrupted`` message is checked against ``message``), then a new trainer built
    from the same config resumes and finishes the run."""
    from rlvr.errors import TrainingInterrupted
    from rlvr.trainer.main import build_trainer

    def run(trainer, at_step: int, message: str = ""):
        interrupt_at(trainer, trainer, "train_step", at_step)
        with pytest.raises(TrainingInterrupted, match=message):
            trainer.fit()
        trainer.tracker.close()
        resumed = build_trainer(trainer.config, progress_bar=False)
        assert resumed.global_step == at_step - 1
        resumed.fit()
        resumed.tracker.close()
        return resumed

    return run


@pytest.fixture
def interrupt():
    """``interrupt_at`` for tests that interrupt elsewhere than at the start of a step."""
    return interrupt_at
