"""miles #3231: each data-parallel rank normalised its loss by its own tokens, so the summed
gradient depended on how the batch was cut over ranks (9x off in the report). rlvr normalises
every micro-batch of every rank by the mini-batch's global token and sequence totals, so the
ranks' gradients add up to the one-process gradient, for every ``loss_agg_mode``.

Fails when ``Actor._optimizer_step`` takes its totals from this rank's rows (``mine``) instead
of the mini-batch's (``mini_rows``). The ranks here are in one process (each a ``DataParallel``
whose collectives add nothing: the test adds the gradients itself); the same property over real
gloo ranks is ``tests/distributed/test_fsdp_parity.py::test_every_loss_agg_mode_is_the_same_over_1_2_and_4_ranks``.
"""

import numpy as np
import pytest
import torch

import rlvr.workers.actor as actor_module
from rlvr.algos.losses import LOSS_AGG_MODES
from rlvr.distributed.worker import DataParallel
from tests.workers.conftest import make_batch
from tests.workers.test_actor import make_actor, with_training_keys


class RankInProcess(DataParallel):
    """Rank ``rank`` of ``world_size``: its share of each mini-batch, and no collective (each rank
    runs the same number of micro-batches here: one row each)."""

    def sum(self, values):
        return list(values)

    def max(self, value):
        return value


def rank_gradient(model_dir, tokenizer, monkeypatch, mode: str, rank: int, world: int) -> torch.Tensor:
    """The gradient one rank accumulates for one optimizer step over all 6 rows, read before
    clipping (which would rescale a wrong gradient to grad_clip and hide it)."""
    actor = make_actor(model_dir, loss_agg_mode=mode, ppo_mini_batch_size=6, ppo_micro_batch_size_per_gpu=1,
                       share_prompt_forward=False)
    batch = with_training_keys(actor, make_batch(tokenizer))
    batch.batch["old_log_probs"] = batch.batch["old_log_probs"] + 0.05  # ratios away from 1: clipping acts
    batch.non_tensor_batch["uid"] = np.array([f"g{i}" for i in range(6)], dtype=object)  # 6 groups: 1, 2, 3, 6 ranks
    actor.dp = RankInProcess(rank, world)
    seen = []

    def record_then_skip(model, optimizer, grad_clip):
        seen.append(torch.cat([p.grad.flatten() for p in model.parameters()]).clone())
        return 1.0, True

    monkeypatch.setattr(actor_module, "clip_and_step", record_then_skip)
    actor.update_policy(batch)
    assert len(seen) == 1
    return seen[0]


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
def test_the_ranks_gradients_add_up_to_the_one_process_gradient(tokenizer, tiny_model_dir, monkeypatch, mode):
    one = rank_gradient(tiny_model_dir, tokenizer, monkeypatch, mode, 0, 1)
    assert one.norm() > 1.0  # a gradient clipping would have rescaled
    for world in (2, 3, 6):
        ranks = [rank_gradient(tiny_model_dir, tokenizer, monkeypatch, mode, rank, world) for rank in range(world)]
        # response lengths 7, 3, 5, 2, 7, 1 (24 tokens): normalised by its own rows' tokens, rank 0 of 2
        # (15 tokens) would weigh its tokens 24/15 = 1.6x, rank 1 (9 tokens) 24/9 = 2.7x
        total = torch.stack(ranks).sum(0)
        assert float((total - one).norm() / one.norm()) < 1e-5, world
        assert all(float(r.norm()) < float(one.norm()) for r in ranks)  # each rank holds only its share
