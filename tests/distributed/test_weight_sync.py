"""The weight broadcast to a rollout pool of its own: bucket layout, exact round trips of mixed
dtypes through gloo on loopback (one root, two receivers, in processes of their own), a version
never visible half-received, and failures that say what happened."""

import multiprocessing as mp
import queue
import time

import pytest
import torch

from rlvr.distributed.weight_sync import (WeightGroup, WeightReceiver, WeightSender, WeightSyncError, bucket_plan,
                                          weight_meta)
from rlvr.distributed.worker import free_port

HOST = "127.0.0.1"


def test_buckets_group_consecutive_tensors_up_to_the_size():
    # float32 (2,) (3,) (10,) (1,) are 8, 12, 40 and 4 bytes: 8 + 12 = 20 fits a 20-byte bucket, 40 goes
    # alone (over the size, never split), then 4
    meta = [("a", (2,), "float32"), ("b", (3,), "float32"), ("c", (10,), "float32"), ("d", (1,), "float32")]
    assert bucket_plan(meta, 20) == [[0, 1], [2], [3]]
    assert bucket_plan(meta, 1 << 20) == [[0, 1, 2, 3]]
    # bf16 is 2 bytes an element: (5,) = 10, (6,) = 12 -> 22 > 20
    assert bucket_plan([("x", (5,), "bfloat16"), ("y", (6,), "bfloat16")], 20) == [[0], [1]]


def test_meta_names_each_parameter_once_tied_ones_too():
    model = torch.nn.Sequential(torch.nn.Embedding(5, 3), torch.nn.Linear(3, 5, bias=False))
    model[1].weight = model[0].weight  # tied: one tensor, sent once
    assert weight_meta(model) == [("0.weight", (5, 3), "float32")]


def weights(version: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(version)
    return {"embed": torch.randn(7, 5, generator=g), "norm": torch.randn(5, generator=g).to(torch.bfloat16),
            "layer.w": torch.randn(33, 5, generator=g), "head": torch.randn(2, 3, generator=g).double()}


META = [(name, tuple(t.shape), str(t.dtype).removeprefix("torch.")) for name, t in weights(0).items()]
BUCKET = 160  # bytes: embed (140) and norm (10) share one, layer.w (660) goes alone (over the size), then head (48)


def _root(port, half_sent, checked, out):
    try:
        sender = WeightSender(WeightGroup(HOST, port, 0, 3, "gloo", timeout_s=60), META, BUCKET)
        sender.send(1, iter(weights(1).items()))

        def paused():  # version 2: half of it, then wait until the receivers have looked
            items = list(weights(2).items())
            for i, item in enumerate(items):
                if i == len(items) // 2:
                    half_sent.set()
                    checked.wait(60)
                yield item

        sender.send(2, paused())
        sender.close()
        out.put(("root", "ok"))
    except BaseException as err:  # pragma: no cover - reported to the test
        out.put(("root", repr(err)))


def _receiver(rank, port, half_sent, checked, out):
    try:
        receiver = WeightReceiver(lambda: WeightGroup(HOST, port, rank, 3, "gloo", timeout_s=60), META, BUCKET)
        first = receiver.take(1, timeout_s=60)
        ok1 = all(torch.equal(first[k], v) and first[k].dtype == v.dtype for k, v in weights(1).items())
        half_sent.wait(60)
        time.sleep(0.3)  # the first half's buckets have arrived at the thread by now
        partial = receiver.has(2)
        if rank == 2:
            checked.set()
        second = receiver.take(2, timeout_s=60)
        ok2 = all(torch.equal(second[k], v) for k, v in weights(2).items())
        dropped_1 = not receiver.has(1)
        # stay in the group until the root's close arrives: a receiver that exits first makes the root's
        # last broadcast fail ("Connection closed by peer"; seen once in a loaded full run)
        end = time.monotonic() + 60
        while not receiver.closed and time.monotonic() < end:
            time.sleep(0.01)
        out.put((rank, (ok1, partial, ok2, not dropped_1)))
    except BaseException as err:  # pragma: no cover
        out.put((rank, repr(err)))


def test_broadcast_round_trip_and_no_half_received_version():
    ctx = mp.get_context("spawn")
    port = free_port(HOST)
    half_sent, checked, out = ctx.Event(), ctx.Event(), ctx.Queue()
    procs = [ctx.Process(target=_root, args=(port, half_sent, checked, out))]
    procs += [ctx.Process(target=_receiver, args=(rank, port, half_sent, checked, out)) for rank in (1, 2)]
    for p in procs:
        p.start()
    try:
        results = dict(out.get(timeout=100) for _ in procs)
    finally:
        for p in procs:
            p.join(10)
            if p.is_alive():
                p.kill()
    assert results["root"] == "ok"
    for rank in (1, 2):
        # version 1 exact (fp32, bf16, fp64 alike); version 2 not visible while half-sent; then exact; 1 dropped
        assert results[rank] == (True, False, True, False), results


def test_a_receiver_that_cannot_join_says_why():
    def refuse():
        raise ConnectionRefusedError("no root at 127.0.0.1:1")

    receiver = WeightReceiver(refuse, META, BUCKET)
    with pytest.raises(WeightSyncError, match="version 3 was not received: the receiving thread failed: "
                                              "ConnectionRefusedError: no root"):
        receiver.take(3, timeout_s=10)


def test_a_version_that_never_comes_times_out():
    receiver = WeightReceiver(lambda: queue.Queue().get(), META, BUCKET)  # joins nothing, forever
    with pytest.raises(WeightSyncError, match="nothing arrived in 0 s"):
        receiver.take(1, timeout_s=0.2)


def test_the_sender_refuses_tensors_other_than_announced():
    sender = WeightSender(None, META, BUCKET)  # a non-root rank: gathers only
    wrong = dict(weights(1))
    wrong["embed"] = torch.zeros(7, 4)
    with pytest.raises(WeightSyncError, match=r"embed \(7, 4\) is not the announced embed \(7, 5\)"):
        sender.send(1, iter(wrong.items()))


def test_persistent_buffers_travel_with_the_parameters():
    """A rollout worker loads what it receives with load_state_dict, which refuses a missing
    persistent buffer (GLM-4-MoE's router e_score_correction_bias): the meta and the tensors
    sent carry the persistent buffers after the parameters, not the non-persistent ones."""
    from rlvr.distributed.weight_sync import weight_tensors

    model = torch.nn.Linear(3, 2)
    model.register_buffer("bias_correction", torch.tensor([0.5, -1.0]))
    model.register_buffer("table", torch.ones(4), persistent=False)
    assert weight_meta(model) == [("weight", (2, 3), "float32"), ("bias", (2,), "float32"),
                                  ("bias_correction", (2,), "float32")]
    sent = dict(weight_tensors(model))
    assert set(sent) == set(model.state_dict()) and torch.equal(sent["bias_correction"], model.bias_correction)
    WeightSender(None, weight_meta(model), 1 << 20).send(1, weight_tensors(model))  # names and shapes as announced
