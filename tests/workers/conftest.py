"""A small rollout-shaped batch: 2 prompts x 3 responses of different lengths, with uids."""

import numpy as np
import pytest
import torch

from rlvr.data.dataset import left_pad
from rlvr.protocol import DataProto


def make_batch(tokenizer, response_lengths=(7, 3, 5, 2, 7, 1), n=3, R=7, seed=0) -> DataProto:
    """Rows are interleaved groups of ``n`` (prompt 0 x n, prompt 1 x n); responses right-padded."""
    texts = ["What is 3 + 9?", "Compute 17 * 2, please."]
    prompts = [tokenizer.apply_chat_template([{"role": "user", "content": t}], add_generation_prompt=True,
                                             tokenize=False) for t in texts]
    prompt_ids = [tokenizer.encode(p, add_special_tokens=False) for p in prompts]
    rows = [prompt_ids[i // n] for i in range(len(response_lengths))]
    ids, mask, pos = left_pad(rows, tokenizer.pad_token_id)
    g = torch.Generator().manual_seed(seed)
    lengths = torch.tensor(response_lengths)
    rmask = (torch.arange(R)[None] < lengths[:, None]).long()  # (B, R)
    responses = torch.randint(100, 2000, (len(rows), R), generator=g) * rmask + tokenizer.pad_token_id * (1 - rmask)
    steps = torch.arange(1, R + 1)
    return DataProto.from_dict(
        {"input_ids": torch.cat([ids, responses], 1), "attention_mask": torch.cat([mask, rmask], 1),
         "position_ids": torch.cat([pos, pos[:, -1:] + steps], 1), "responses": responses, "response_mask": rmask},
        {"uid": np.array([f"g{i // n}" for i in range(len(rows))], dtype=object)},
    )


@pytest.fixture
def batch(tokenizer):
    return make_batch(tokenizer)
