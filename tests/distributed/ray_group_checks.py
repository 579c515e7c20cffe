"""Checks of the Ray worker group with small fake workers, run by ``test_ray_group.py`` inside a
loopback-only network namespace (one Ray start for all of them). Exits non-zero on a failure."""

import os
import sys
import tempfile
from pathlib import Path

import numpy as np
import ray
import torch
from ray.util import placement_group_table

from rlvr.distributed import ray_workers
from rlvr.distributed.dispatch import Dispatch, register
from rlvr.distributed.ray_workers import (RayClassWithInitArgs, RayResourcePool, RayWorkerGroup, ResourceError,
                                          WorkerError, create_colocated_worker_cls, init_ray)
from rlvr.distributed.worker import Worker
from rlvr.protocol import DataProto


class Doubler(Worker):
    def __init__(self, factor):
        super().__init__()
        self.factor = factor

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def init_model(self):
        return (self.rank, self.world_size, os.environ["MASTER_ADDR"], os.environ.get("GLOO_SOCKET_IFNAME"))

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def compute_log_prob(self, data):
        out = DataProto.from_dict({"old_log_probs": data.batch["x"] * self.factor + self.rank})
        return out

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def generate_sequences(self, prompts):
        """Rank 0's responses are 3 tokens wide, rank 1's 1 token (its rows stopped early)."""
        width, rows = 3 - 2 * self.rank, len(prompts)
        responses = torch.full((rows, width), 7)
        ones = torch.ones(rows, width, dtype=torch.long)
        out = DataProto.from_dict({"prompts": prompts.batch["ids"], "responses": responses, "response_mask": ones,
                                   "input_ids": torch.cat([prompts.batch["ids"], responses], 1),
                                   "attention_mask": torch.ones(rows, 1 + width, dtype=torch.long),
                                   "position_ids": torch.arange(1 + width).repeat(rows, 1)})
        out.meta_info["pad_token_id"] = 0
        return out

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def compute_values(self, data):
        """Rank 1 answers a key rank 0 does not: the driver cannot join the answers."""
        keys = {"values": data.batch["x"]} | ({"extra": data.batch["x"]} if self.rank == 1 else {})
        return DataProto.from_dict(keys)

    def fail(self):
        raise ValueError(f"broken on purpose on rank {self.rank}")


class Counter(Worker):
    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def init_model(self):
        return "critic ready"

    def pid(self):
        return os.getpid()


class BrokenAtStart(Worker):
    def __init__(self):
        super().__init__()
        raise ValueError("broken at start")


def live_placement_groups() -> list[tuple[str, str]]:
    """(name, state) of every placement group Ray has not removed."""
    return [(pg["name"], pg["state"]) for pg in placement_group_table().values() if pg["state"] != "REMOVED"]


def main(run_dir):
    other = Path(tempfile.mkdtemp(prefix="rlvr-ray-"))  # another run's Ray folder, maybe live
    session = init_ray(None, 2, Path(run_dir))
    pool = RayResourcePool([2])
    colocated = create_colocated_worker_cls({"actor": RayClassWithInitArgs(Doubler, 10),
                                             "critic": RayClassWithInitArgs(Counter)})
    group = RayWorkerGroup(pool, colocated, run_dir)
    groups = group.spawn(["actor", "critic"])
    actor, critic = groups["actor"], groups["critic"]
    # ranks and the rendezvous address from the environment; every rank answers, in rank order
    assert actor.init_model() == [(0, 2, "127.0.0.1", "lo"), (1, 2, "127.0.0.1", "lo")], actor.init_model()
    assert critic.init_model() == ["critic ready", "critic ready"]
    # colocated: the two roles share each rank's process
    assert critic.execute_all("pid") == [w["pid"] for w in group.where]
    assert critic.execute_rank_zero("pid") == group.where[0]["pid"]
    # DP_COMPUTE_PROTO: whole groups per rank, concatenated in rank order; 3 prompts padded to 4, trimmed
    data = DataProto.from_dict({"x": torch.arange(3.0)}, {"uid": np.array(["a", "b", "c"], dtype=object)})
    out = actor.compute_log_prob(data)
    assert out.batch["old_log_probs"].tolist() == [0.0, 10.0, 21.0], out.batch["old_log_probs"]  # row 2 on rank 1
    # responses of different widths per rank: padded to the widest rank with the pad id, in rank order
    prompts = DataProto.from_dict({"ids": torch.tensor([[5], [6], [8], [9]])},
                                  {"uid": np.array(["a", "b", "c", "d"], dtype=object)})
    out = actor.generate_sequences(prompts)
    assert out.batch["responses"].tolist() == [[7, 7, 7], [7, 7, 7], [7, 0, 0], [7, 0, 0]], out.batch["responses"]
    assert out.batch["input_ids"].tolist()[2] == [8, 7, 0, 0]
    assert out.batch["attention_mask"].tolist()[3] == [1, 1, 0, 0]
    # the driver failing to join the ranks' answers is a WorkerError naming the method and the rank
    try:
        actor.compute_values(data)
        raise AssertionError("no error")
    except WorkerError as err:
        assert str(err).startswith("compute_values: the answers of ranks [0, 1] could not be joined: DataProtoError: "
                                   "rank 1 answered keys ['extra', 'values'], rank 0 ['values']"), err
    # as is a batch that cannot be split over the ranks
    try:
        actor.compute_log_prob(DataProto.from_dict({"x": torch.arange(4.0)},
                                                   {"uid": np.array(["a", "b", "a", "b"], dtype=object)}))
        raise AssertionError("no error")
    except WorkerError as err:
        assert str(err).startswith("compute_log_prob: the arguments could not be split over the 2 ranks: "
                                   "DispatchError: "), err
    # a failing rank stops the call with its rank and its error
    try:
        actor.execute_all("fail")
        raise AssertionError("no error")
    except WorkerError as err:
        assert "rank 0 failed in fail: ValueError: broken on purpose on rank 0" in str(err) or \
            "rank 1 failed in fail: ValueError: broken on purpose on rank 1" in str(err), err
    # the failed call killed the group, and its placement group went with it: the CPUs are free again
    assert live_placement_groups() == [], live_placement_groups()
    ray_workers.PLACEMENT_TIMEOUT_S = 30  # a pool left behind fails the next start in 30 s, not 120
    # a worker that raises while starting: its error's own line (Ray's message puts it last), and
    # the pool released, so the next group (same pool name, as a second run in one Ray) starts
    try:
        RayWorkerGroup(RayResourcePool([2], name="again"),
                       create_colocated_worker_cls({"actor": RayClassWithInitArgs(BrokenAtStart)}))
        raise AssertionError("no error")
    except WorkerError as err:
        assert "ValueError: broken at start" in str(err), err
    assert live_placement_groups() == [], live_placement_groups()
    again = RayWorkerGroup(RayResourcePool([2], name="again"),
                           create_colocated_worker_cls({"critic": RayClassWithInitArgs(Counter)}))
    assert again.spawn(["critic"])["critic"].init_model() == ["critic ready", "critic ready"]
    again.kill()
    assert live_placement_groups() == [], live_placement_groups()
    # more GPUs than the cluster has: refused with the numbers before any placement group
    try:
        RayResourcePool([2], use_gpu=True).get_placement_groups()
        raise AssertionError("no error")
    except ResourceError as err:
        assert "needs 2 GPUs (the cluster has 0)" in str(err), err
    # the end: Ray's folder under /tmp removed, this one only; its logs kept in the run folder
    mine = session.temp_dir
    session.shutdown()
    assert not ray.is_initialized() and not mine.exists() and other.is_dir(), (mine, other)
    assert any((Path(run_dir) / "ray" / "session_latest" / "logs").glob("raylet.*")), list(Path(run_dir).rglob("*"))
    other.rmdir()
    print("ALL CHECKS PASSED")


if __name__ == "__main__":
    main(sys.argv[1])
