"""The batch a reward manager scores, built from response texts (the rewards tests' one builder)."""

import torch

from rlvr.protocol import DataProto


def response_batch(tokenizer, texts, sources=None, truths=None, extra_info: bool = False) -> DataProto:
    """``texts`` as right-padded responses with their mask; ``data_source`` "x" and ground truth "1"
    unless given, and ``extra_info`` {"index": i} when asked."""
    ids = [tokenizer.encode(t, add_special_tokens=False) for t in texts]
    width = max(len(i) for i in ids)
    responses = torch.full((len(ids), width), tokenizer.pad_token_id)
    mask = torch.zeros(len(ids), width, dtype=torch.long)
    for r, row in enumerate(ids):
        responses[r, :len(row)] = torch.tensor(row)
        mask[r, :len(row)] = 1
    columns = {"data_source": sources or ["x"] * len(ids),
               "reward_model": [{"ground_truth": t} for t in (truths or ["1"] * len(ids))]}
    if extra_info:
        columns["extra_info"] = [{"index": i} for i in range(len(ids))]
    return DataProto.from_dict({"responses": responses, "response_mask": mask}, columns)
