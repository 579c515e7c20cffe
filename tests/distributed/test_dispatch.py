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


PAD = 99  # the tokenizer's pad id, told by the rollout in meta_info


def rank_rollout(prompts, prompt_mask, prompt_positions, responses, lengths, log_probs):
    """One rank's generate_sequences answer, written out by hand: responses right-padded with PAD
    to this rank's longest row; position ids continue after the prompt over the padding too."""
    prompts, responses = torch.tensor(prompts), torch.tensor(responses)
    present = torch.tensor([[int(t < n) for t in range(responses.shape[1])] for n in lengths])
    positions = torch.tensor(prompt_positions)
    steps = torch.arange(1, responses.shape[1] + 1)
    out = DataProto.from_dict({"prompts": prompts, "responses": responses, "response_mask": present,
                               "input_ids": torch.cat([prompts, responses], 1),
                               "attention_mask": torch.cat([torch.tensor(prompt_mask), present], 1),
                               "position_ids": torch.cat([positions, positions[:, -1:] + steps], 1),
                               "rollout_log_probs": torch.tensor(log_probs)},
                              {"finish_reason": ["stop"] * len(lengths)})
    out.meta_info["pad_token_id"] = PAD
    return out


def uneven_rollouts():
    # rank 0: rows of 3 and 2 tokens (width 3); rank 1: rows of 1 token each (width 1)
    rank0 = rank_rollout([[5, 6], [5, 6]], [[1, 1], [1, 1]], [[0, 1], [0, 1]], [[7, 8, 2], [7, 2, PAD]], [3, 2],
                         [[-0.5, -0.25, -1.0], [-0.5, -2.0, 0.0]])
    rank1 = rank_rollout([[PAD, 4], [PAD, 4]], [[0, 1], [0, 1]], [[0, 0], [0, 0]], [[9], [2]], [1, 1],
                         [[-3.0], [-0.125]])
    return rank0, rank1


def test_rollouts_of_different_widths_are_padded_to_the_widest_rank():
    """Each rank pads its responses to its own longest row; the group's answer has the layout one
    process would give the whole batch: every rank's rows right-padded to the widest rank, with
    the pad id in token ids, 0 in masks and log-probs, position ids counting on."""
    out = collect(Dispatch.DP_COMPUTE_PROTO, list(uneven_rollouts()))
    b = out.batch
    assert b["responses"].tolist() == [[7, 8, 2], [7, 2, PAD], [9, PAD, PAD], [2, PAD, PAD]]
    assert b["response_mask"].tolist() == [[1, 1, 1], [1, 1, 0], [1, 0, 0], [1, 0, 0]]
    assert b["input_ids"].tolist() == [[5, 6, 7, 8, 2], [5, 6, 7, 2, PAD], [PAD, 4, 9, PAD, PAD], [PAD, 4, 2, PAD, PAD]]
    assert b["attention_mask"].tolist() == [[1, 1, 1, 1, 1], [1, 1, 1, 1, 0], [0, 1, 1, 0, 0], [0, 1, 1, 0, 0]]
    # rank 1's prompts end at position 0, so its response is at 1 and the padding counts 2, 3 (as
    # rank 0's own padding of row 1 counts on to 4)
    assert b["position_ids"].tolist() == [[0, 1, 2, 3, 4], [0, 1, 2, 3, 4], [0, 0, 1, 2, 3], [0, 0, 1, 2, 3]]
    assert b["rollout_log_probs"].tolist() == [[-0.5, -0.25, -1.0], [-0.5, -2.0, 0.0], [-3.0, 0.0, 0.0],
                                               [-0.125, 0.0, 0.0]]
    assert b["prompts"].tolist() == [[5, 6], [5, 6], [PAD, 4], [PAD, 4]]
    assert out.non_tensor_batch["finish_reason"].tolist() == ["stop"] * 4
    assert out.meta_info["pad_token_id"] == PAD
    # the same answers in the other order: rank 0 is the narrow one now
    rank0, rank1 = uneven_rollouts()
    swapped = collect(Dispatch.DP_COMPUTE_PROTO, [rank1, rank0])
    assert swapped.batch["responses"].tolist() == [[9, PAD, PAD], [2, PAD, PAD], [7, 8, 2], [7, 2, PAD]]


def test_uneven_rollouts_padded_then_trimmed_of_padding_rows():
    out = collect(Dispatch.DP_COMPUTE_PROTO, list(uneven_rollouts()), pad_rows=1)
    assert out.batch["responses"].tolist() == [[7, 8, 2], [7, 2, PAD], [9, PAD, PAD]]


def test_uneven_rollouts_without_a_pad_id_are_refused_by_name():
    rank0, rank1 = uneven_rollouts()
    del rank0.meta_info["pad_token_id"], rank1.meta_info["pad_token_id"]
    with pytest.raises(ValueError, match=r"response widths \[3, 1\].*meta_info\['pad_token_id'\]"):
        collect(Dispatch.DP_COMPUTE_PROTO, [rank0, rank1])


def test_answers_that_do_not_fit_together_name_the_rank():
    rank0, rank1 = uneven_rollouts()
    rank1.batch["entropys"] = torch.zeros(2, 1)
    with pytest.raises(ValueError, match=r"rank 1 answered keys .*'entropys'.* rank 0"):
        collect(Dispatch.DP_COMPUTE_PROTO, [rank0, rank1])
    a = DataProto.from_dict({"old_log_probs": torch.zeros(2, 4)})
    b = DataProto.from_dict({"old_log_probs": torch.zeros(2, 5)})
    with pytest.raises(ValueError, match=r"rank 1 answered 'old_log_probs' of shape \(2, 5\), rank 0 of \(2, 4\)"):
        collect(Dispatch.DP_COMPUTE_PROTO, [a, b])


def test_groups_of_split_episodes_go_to_the_ranks_whole_by_group_count():
    """Groups of 4, 3, 3 and 2 rows (an agent's split episodes): each rank gets two whole groups,
    rows 0-6 and 7-11, not six rows each."""
    sizes = [4, 3, 3, 2]
    uids = np.array([f"g{g}" for g, size in enumerate(sizes) for _ in range(size)], dtype=object)
    data = DataProto.from_dict({"x": torch.arange(12, dtype=torch.float32)}, {"uid": uids})
    workers = [FakeWorker(0), FakeWorker(1)]
    out = run_group(workers, "compute_log_prob", data)
    assert workers[0].calls == [["g0"] * 4 + ["g1"] * 3] and workers[1].calls == [["g2"] * 3 + ["g3"] * 2]
    assert out.batch["old_log_probs"].tolist() == [10.0 * i + (i >= 7) for i in range(12)]


def agent_rollout(rows: int, width: int, metrics: dict) -> DataProto:
    """A rank's agent-loop rollout: ``rows`` rows, responses ``width`` wide, its own rollout_metrics."""
    out = DataProto.from_dict({"responses": torch.ones(rows, width, dtype=torch.long),
                               "input_ids": torch.ones(rows, 2 + width, dtype=torch.long),
                               "attention_mask": torch.ones(rows, 2 + width, dtype=torch.long)})
    out.meta_info.update(pad_token_id=0, rollout_metrics=dict(metrics))
    return out


def test_ranks_agent_rollout_metrics_are_joined_counts_summed_means_weighted_by_episodes():
    """Each rank's AgentLoopRollout reports its own counters and the loops' means; the batch's are
    the sums of the counts and the means over all episodes, not one rank's (and not a refusal)."""
    parts = [agent_rollout(4, 3, {"agent/calls": 4.0, "agent/truncated": 1.0, "agent/split_samples": 0.0,
                                  "agent/response_len": 1.5}),
             agent_rollout(4, 1, {"agent/calls": 4.0, "agent/truncated": 0.0, "agent/split_samples": 0.0,
                                  "agent/response_len": 3.25})]
    out = collect(Dispatch.DP_COMPUTE_PROTO, parts)
    # 4 + 4 calls, 1 + 0 truncated; (4 * 1.5 + 4 * 3.25) / 8 episodes = (6 + 13) / 8 = 2.375
    assert out.meta_info["rollout_metrics"] == {"agent/calls": 8.0, "agent/truncated": 1.0,
                                                "agent/split_samples": 0.0, "agent/response_len": 2.375}
    assert len(out) == 8 and out.batch["responses"].shape == (8, 3)
    # split samples: rank 0's 5 rows are 4 episodes (one split in two), rank 1's 2 rows 2 episodes;
    # (4 * 1.0 + 2 * 4.0) / 6 = 2.0; context breaks 1 + 2 = 3
    parts = [agent_rollout(5, 2, {"agent/calls": 6.0, "agent/split_samples": 1.0, "agent/context_breaks": 1.0,
                                  "agent/response_len": 1.0}),
             agent_rollout(2, 2, {"agent/calls": 2.0, "agent/split_samples": 0.0, "agent/context_breaks": 2.0,
                                  "agent/response_len": 4.0})]
    assert collect(Dispatch.DP_COMPUTE_PROTO, parts).meta_info["rollout_metrics"] == {
        "agent/calls": 8.0, "agent/split_samples": 1.0, "agent/context_breaks": 3.0, "agent/response_len": 2.0}
    # answers without rollout metrics gain none
    plain = [agent_rollout(1, 1, {}), agent_rollout(1, 1, {})]
    for part in plain:
        del part.meta_info["rollout_metrics"]
    assert "rollout_metrics" not in collect(Dispatch.DP_COMPUTE_PROTO, plain).meta_info
