"""Dispatch and collect with fake workers, no Ray: a DataProto is split by rank keeping prompt
groups whole, answers come back in rank order, RANK_ZERO runs one rank, bad splits explain
themselves, and LocalWorkerGroup takes the same path at world size 1."""

import numpy as np
import pytest
import torch

from rlvr.distributed import LocalWorkerGroup
from rlvr.distributed.dispatch import Dispatch, DispatchError, collect, dispatch, register, registration
from rlvr.protocol import DataProto


class FakeWorker:
    def __init__(self, rank):
        self.rank, self.calls = rank, []

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def compute_log_prob(self, data):
        self.calls.append(list(data.non_tensor_batch["uid"]))
        out = DataProto.from_dict({"old_log_probs": data.batch["x"] * 10 + self.rank})
        out.meta_info["metrics"] = {"rank": self.rank}
        return out

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def save_checkpoint(self, folder):
        self.calls.append(folder)
        return self.rank

    @register(dispatch_mode=Dispatch.RANK_ZERO)
    def load_checkpoint(self, folder):
        self.calls.append(folder)
        return f"rank {self.rank}"


def run_group(workers, name, *args, **kwargs):
    """What a remote group does: dispatch, call each rank (rank 0 only for RANK_ZERO), collect."""
    reg = registration(getattr(workers[0], name))
    per_rank = dispatch(reg.dispatch_mode, len(workers), args, kwargs)
    ranks = workers[:1] if reg.dispatch_mode is Dispatch.RANK_ZERO else workers
    return collect(reg.dispatch_mode, [getattr(w, name)(*a, **k) for w, (a, k) in zip(ranks, per_rank)])


def batch(groups=4, n=3):
    uids = np.array([f"g{i // n}" for i in range(groups * n)], dtype=object)
    return DataProto.from_dict({"x": torch.arange(groups * n, dtype=torch.float32)}, {"uid": uids})


def test_dp_split_keeps_groups_whole_and_collects_in_rank_order():
    workers = [FakeWorker(0), FakeWorker(1)]
    out = run_group(workers, "compute_log_prob", batch())
    # rank 0 gets groups g0, g1 (rows 0-5), rank 1 gets g2, g3 (rows 6-11); x*10 + rank comes back in order
    assert workers[0].calls == [["g0"] * 3 + ["g1"] * 3] and workers[1].calls == [["g2"] * 3 + ["g3"] * 3]
    assert out.batch["old_log_probs"].tolist() == [10.0 * i + (i >= 6) for i in range(12)]
    assert out.meta_info["metrics"] == {"rank": [0, 1]}  # verl's concat: metrics become lists


def test_one_to_all_and_rank_zero():
    workers = [FakeWorker(0), FakeWorker(1)]
    assert run_group(workers, "save_checkpoint", "ckpt") == [0, 1]
    assert run_group(workers, "load_checkpoint", "ckpt") == "rank 0"
    assert workers[1].calls == ["ckpt"]  # rank 1 saved but did not load


def test_splits_that_cannot_be_even_are_refused_with_the_numbers():
    with pytest.raises(DispatchError, match="12 rows in 3 groups cannot be split evenly over 2 ranks"):
        run_group([FakeWorker(0), FakeWorker(1)], "compute_log_prob", batch(groups=3, n=4))
    scattered = batch()
    scattered.non_tensor_batch["uid"] = np.array(["g0", "g1"] * 6, dtype=object)
    with pytest.raises(DispatchError, match="must be contiguous"):
        run_group([FakeWorker(0), FakeWorker(1)], "compute_log_prob", scattered)


def test_all_to_all_needs_one_value_per_rank():
    assert dispatch(Dispatch.ALL_TO_ALL, 2, ([1, 2],), {"k": ["a", "b"]}) == [((1,), {"k": "a"}), ((2,), {"k": "b"})]
    with pytest.raises(DispatchError, match="one value per rank"):
        dispatch(Dispatch.ALL_TO_ALL, 2, (1,), {})


def test_local_worker_group_goes_through_dispatch_at_world_size_one():
    worker = FakeWorker(0)
    wg = LocalWorkerGroup(worker)
    out = wg.compute_log_prob(batch())
    assert out.batch["old_log_probs"].tolist() == [10.0 * i for i in range(12)]
    assert out.meta_info["metrics"] == {"rank": 0}  # one rank: the answer itself, not a list
    assert wg.save_checkpoint("c") == 0 and wg.load_checkpoint("c") == "rank 0"
    assert registration(type(worker).compute_log_prob).dispatch_mode is Dispatch.DP_COMPUTE_PROTO


def test_every_worker_method_declares_its_dispatch_mode():
    from rlvr.distributed.dispatch import ATTR
    from rlvr.workers.critic import CriticWorker
    from rlvr.workers.hybrid import ActorRolloutRefWorker

    data_methods = {"generate_sequences", "compute_log_prob", "compute_ref_log_prob", "update_actor",
                    "compute_values", "update_critic"}
    for cls in (ActorRolloutRefWorker, CriticWorker):
        for name in ("init_model", "save_checkpoint", "load_checkpoint", *data_methods):
            if not hasattr(cls, name):
                continue
            reg = getattr(getattr(cls, name), ATTR)
            assert reg.dispatch_mode is (Dispatch.DP_COMPUTE_PROTO if name in data_methods else Dispatch.ONE_TO_ALL)
