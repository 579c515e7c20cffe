"""Validation reports how many of its rewards were not numbers, raised or timed out: they enter
``mean@n`` as placeholders (reward.failure_score), and the counts say how many."""

import numpy as np
import pytest
import torch

from rlvr.config.schema import CustomRewardFunctionConfig, RewardConfig
from rlvr.protocol import DataProto
from rlvr.rewards import RewardManager
from rlvr.trainer import evaluate as evaluate_module

REWARD = '''
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    if solution_str == "n":
        return float("nan")
    if solution_str == "e":
        raise ValueError("broken")
    return 1.0 if solution_str == "r" else 0.0
'''


class Tokenizer:
    pad_token_id = 0

    def decode(self, ids, skip_special_tokens=True):
        return "".join(chr(int(i)) for i in ids)


class Dataset:
    """Four prompts; the scripted responses answer r(ight), w(rong), n(aN), e(rror)."""

    def __len__(self):
        return 4

    def __getitem__(self, i):
        return i

    def collate(self, rows):
        return DataProto.from_dict({"input_ids": torch.zeros(len(rows), 2, dtype=torch.long),
                                    "attention_mask": torch.ones(len(rows), 2, dtype=torch.long),
                                    "position_ids": torch.zeros(len(rows), 2, dtype=torch.long)},
                                   {"data_source": np.array(["src"] * len(rows), dtype=object),
                                    "reward_model": np.array([{"ground_truth": "r"}] * len(rows), dtype=object)})


def scripted(answers: str):
    """A generate function that answers the next characters of ``answers``, one per row."""
    left = list(answers)

    def generate(gen):
        texts = [left.pop(0) for _ in range(len(gen))]
        return DataProto.from_dict({"responses": torch.tensor([[ord(c)] for c in texts]),
                                    "response_mask": torch.ones(len(gen), 1, dtype=torch.long)})
    return generate


def test_validation_counts_its_invalid_and_failed_rewards(tmp_path):
    """Failed before the fix: the counts were dropped; mean@1 averaged the placeholders silently."""
    path = tmp_path / "reward.py"
    path.write_text(REWARD)
    cfg = RewardConfig(custom_reward_function=CustomRewardFunctionConfig(str(path)), failure_score=-1.0,
                       max_failed_fraction=1.0)
    metrics = evaluate_module.evaluate(scripted("rwne"), RewardManager(Tokenizer(), cfg), Dataset(), Tokenizer(), 1, {},
                                       batch_size=2)  # two batches: the counts are summed over them
    assert metrics["val-aux/reward/num_invalid"] == 1.0 and metrics["val-aux/reward/num_invalid/src"] == 1.0
    assert metrics["val-aux/reward/num_errors"] == 1.0 and metrics["val-aux/reward/num_timeouts"] == 0.0
    # mean@1 over the 4 prompts: right 1.0, wrong 0.0, NaN's placeholder -1.0, the error's -1.0:
    # (1 + 0 - 1 - 1) / 4 = -0.25
    assert metrics["val-core/src/reward/mean@1"] == pytest.approx(-0.25)
