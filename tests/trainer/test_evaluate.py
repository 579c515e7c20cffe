"""Validation batches sample independently of each other (issue 28 §5)."""

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rlvr.config.schema import DataConfig, RewardConfig, RolloutConfig
from rlvr.data import RLHFDataset
from rlvr.models import load_model_and_tokenizer
from rlvr.rewards import RewardManager
from rlvr.rollout import build_rollout
from rlvr.trainer import evaluate as evaluate_module


@pytest.mark.parametrize("batch_size", [2])
def test_each_validation_batch_draws_its_own_samples(tmp_path, tiny_model_dir, monkeypatch, batch_size):
    # Four rows with the same prompt, validated in two batches of two, sampled at T = 1 from a
    # random tiny model (near-uniform over 49k tokens). With one seed for every batch, row i of
    # batch 1 drew the same uniforms as row i of batch 0 and so the same tokens; each batch now
    # has its own seed, and two 8-token samples from a near-uniform 49k vocabulary never agree.
    rows = [{"data_source": "arithmetic", "prompt": [{"role": "user", "content": "What is 2 + 2?"}],
             "reward_model": {"ground_truth": "4", "style": "rule"}} for _ in range(4)]
    path = tmp_path / "val.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path)
    model, tokenizer = load_model_and_tokenizer(str(tiny_model_dir))
    dataset = RLHFDataset([str(path)], tokenizer, DataConfig(max_prompt_length=64))
    rollout = build_rollout(model, tokenizer, RolloutConfig(), 8)
    responses = []

    def generate(gen):
        out = rollout.generate_sequences(gen)
        responses.extend(out.batch["responses"].tolist())
        return out

    evaluate_module.evaluate(generate, RewardManager(tokenizer, RewardConfig()), dataset, tokenizer, 1,
                             {"do_sample": True, "temperature": 1.0}, batch_size, seed=5)
    assert len(responses) == 4
    assert responses[0] != responses[1]  # rows of one batch differ (their row numbers)
    assert responses[0] != responses[2] and responses[1] != responses[3]  # and row i differs across batches

    # the same call again draws the same samples: the per-batch seeds are reproducible
    first = list(responses)
    responses.clear()
    evaluate_module.evaluate(generate, RewardManager(tokenizer, RewardConfig()), dataset, tokenizer, 1,
                             {"do_sample": True, "temperature": 1.0}, batch_size, seed=5)
    assert responses == first
