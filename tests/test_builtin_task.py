"""The built-in model on the built-in task: GRPO needs an accuracy that is neither ~0 nor ~1."""

import pytest
import torch

from rlvr.config.schema import DataConfig, RolloutConfig
from rlvr.data import RLHFDataset
from rlvr.data.prepare import prepare_arithmetic
from rlvr.models import load_model, load_tokenizer
from rlvr.rewards import get_scorer
from rlvr.rollout import NativeRollout


@pytest.mark.slow
def test_untrained_greedy_accuracy_leaves_room_to_learn(tmp_path):
    paths = prepare_arithmetic(tmp_path, train_size=10, test_size=64, seed=0)
    tokenizer = load_tokenizer("builtin")
    dataset = RLHFDataset(paths["test"], tokenizer, DataConfig(max_prompt_length=128))
    # rlvr's engine (its greedy tokens equal transformers' generate: tests/rollout/test_engine.py), ~3x faster
    rollout = NativeRollout(load_model("builtin"), tokenizer, RolloutConfig(do_sample=False), 48)
    items = [dataset[i] for i in range(len(dataset))]
    batch = dataset.collate(items)
    out = rollout.generate_sequences(batch)
    scores = []
    for i, item in enumerate(items):
        text = tokenizer.decode(out.batch["responses"][i][out.batch["response_mask"][i].bool()],
                                skip_special_tokens=True)
        scores.append(get_scorer("arithmetic")("arithmetic", text, item["reward_model"]["ground_truth"], None))
    accuracy = sum(scores) / len(scores)
    print(f"built-in model, greedy accuracy on 64 arithmetic problems: {accuracy:.3f}")
    assert 0.10 <= accuracy <= 0.60
