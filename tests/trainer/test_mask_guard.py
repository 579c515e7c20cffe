"""The loss mask lies within response_mask, which lies within the attention mask's response part
(``check_masks``): a mask that truncation or a tool loop left out of step stops the run."""

import numpy as np
import pytest
import torch

from rlvr.errors import StopTraining
from rlvr.protocol import DataProto
from rlvr.trainer.main import build_trainer
from rlvr.trainer.guards import check_masks


def masks(response, attention_tail, train=None):
    """One prompt token, then the response part: (B, 1 + R) attention, (B, R) masks."""
    response = torch.tensor(response)
    tensors = {"response_mask": response, "attention_mask": torch.cat([torch.ones(len(response), 1, dtype=torch.long),
                                                                       torch.tensor(attention_tail)], 1)}
    if train is not None:
        tensors["train_mask"] = torch.tensor(train, dtype=torch.float32)
    return DataProto.from_dict(tensors, {"uid": np.array(["a"] * len(response), dtype=object)})


def test_nested_masks_pass_and_each_leak_is_named():
    # row 0: 3 tokens; row 1: a tool token (attention 1, response 0) between two sampled ones
    check_masks(masks([[1, 1, 1], [1, 0, 1]], [[1, 1, 1], [1, 1, 1]], train=[[1, 1, 0], [0, 0, 0]]), step=1)
    with pytest.raises(StopTraining, match=r"step 3: the loss mask is outside response_mask at 1 token\(s\), first at "
                                           r"row 1, response token 1"):
        check_masks(masks([[1, 1, 1], [1, 0, 1]], [[1, 1, 1], [1, 1, 1]], train=[[1, 1, 1], [1, 1, 1]]), step=3)
    with pytest.raises(StopTraining, match=r"response_mask marks tokens the attention mask does not hold at 2 "
                                           r"token\(s\), first at row 0, response token 2"):
        check_masks(masks([[1, 1, 1], [1, 1, 1]], [[1, 1, 0], [1, 1, 0]]), step=1)


def test_a_truncation_applied_to_one_mask_only_stops_the_run(tiny_config, tmp_path):
    """The engine's output truncated in the attention mask but not in response_mask (the last
    response token dropped from one): stopped at step 1, before any update."""
    # the freshness probe off: it decodes through the same broken engine and would stop the run first
    trainer = build_trainer(tiny_config("trainer.val_before_train=false", "data.val_files=[]",
                                        "trainer.freshness_check_freq=-1",
                                        f"trainer.default_local_dir={tmp_path}"), progress_bar=False)
    worker = trainer.rollout_wg.worker if hasattr(trainer.rollout_wg, "worker") else trainer.rollout_wg
    generate = worker.generate_sequences

    def truncated_in_one_mask(prompts):
        out = generate(prompts)
        out.batch["attention_mask"][:, -1] = 0
        out.batch["response_mask"][:, -1] = 1
        return out

    worker.generate_sequences = truncated_in_one_mask
    before = [p.detach().clone() for p in trainer.wg.worker.actor.model.parameters()]
    with pytest.raises(StopTraining, match=r"step 1: response_mask marks tokens the attention mask does not hold"):
        trainer.fit()
    trainer.tracker.close()
    assert all(torch.equal(a, p) for a, p in zip(before, trainer.wg.worker.actor.model.parameters()))
