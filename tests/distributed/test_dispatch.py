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

    data_methods = {"generate_sequences", "compute_log_prob", "compute_ref_log_prob", "compute_values"}
    updates = {"update_actor", "update_critic"}  # the whole batch on every rank: the same shuffled mini-batches
    for cls in (ActorRolloutRefWorker, CriticWorker):
        for name in ("init_model", "save_checkpoint", "load_checkpoint", *data_methods, *updates):
            if not hasattr(cls, name):
                continue
            reg = getattr(getattr(cls, name), ATTR)
            expected = Dispatch.DP_COMPUTE_PROTO if name in data_methods else \
                Dispatch.DP_MINI_BATCH_PROTO if name in updates else Dispatch.ONE_TO_ALL
            assert reg.dispatch_mode is expected, name


def test_mini_batch_mode_gives_every_rank_everything_and_returns_rank_zeros_answer():
    data = DataProto.from_dict({"x": torch.arange(4.0)}, {"uid": np.array(["a", "a", "b", "b"], dtype=object)})
    calls = dispatch(Dispatch.DP_MINI_BATCH_PROTO, 2, (data,), {})
    assert [len(args[0]) for args, _ in calls] == [4, 4]
    assert collect(Dispatch.DP_MINI_BATCH_PROTO, ["rank0", "rank1"]) == "rank0"


def test_validation_batches_are_padded_to_whole_groups_per_rank_and_trimmed_back():
    from rlvr.distributed.dispatch import pad_groups
    # 3 prompts (n=1) over 2 ranks: one copy of the last row makes 4; the answer loses it again
    data = DataProto.from_dict({"x": torch.arange(3.0)}, {"uid": np.array(["a", "b", "c"], dtype=object)})
    padded, pad = pad_groups(data, 2)
    assert pad == 1 and padded.batch["x"].tolist() == [0, 1, 2, 2]
    assert list(padded.non_tensor_batch["uid"]) == ["a", "b", "c", "c#pad0"]  # its own group
    parts = [args[0] for args, _ in dispatch(Dispatch.DP_COMPUTE_PROTO, 2, (padded,), {})]
    out = collect(Dispatch.DP_COMPUTE_PROTO, parts, pad_rows=pad)
    assert out.batch["x"].tolist() == [0, 1, 2]
    # groups of 2 rows: 3 groups over 2 ranks -> one whole group added
    data = DataProto.from_dict({"x": torch.arange(6.0)}, {"uid": np.array(list("aabbcc"), dtype=object)})
    padded, pad = pad_groups(data, 2)
    assert pad == 2 and padded.batch["x"].tolist()[-2:] == [4, 5]
    assert pad_groups(padded, 2)[1] == 0  # already even: untouched


def test_data_parallel_share_is_contiguous_whole_groups():
    from rlvr.distributed.worker import DataParallel
    groups = [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert DataParallel(0, 2).share(groups) == [0, 1, 2, 3]
    assert DataParallel(1, 2).share(groups) == [4, 5, 6, 7]
    assert DataParallel(0, 1).share(groups) == list(range(8))
    with pytest.raises(ValueError, match="3 groups cannot be split evenly over 2 ranks"):
        DataParallel(0, 2).share(groups[:3])
