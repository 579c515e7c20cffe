"""One vLLM engine over two ranks (``rollout.tensor_model_parallel_size=2``): the protocol that
keeps the ranks' engines in step, on two gloo processes with a recording stand-in for vLLM (the
real engine over two ranks: ``tests/distributed/test_fsdp_parity.py``, tp2)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import rlvr
from rlvr.distributed.worker import free_port

RANK_SCRIPT = Path(__file__).with_name("engine_ranks_rank.py")


def run_two_ranks(case: str, out: Path) -> list[dict]:
    port = str(free_port())
    procs = [subprocess.Popen([sys.executable, str(RANK_SCRIPT), case, str(out)], text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              env={**os.environ, "PYTHONPATH": str(Path(rlvr.__file__).parents[1]), "RANK": str(r),
                                   "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port,
                                   "GLOO_SOCKET_IFNAME": "lo"}) for r in range(2)]
    try:
        logs = [p.communicate(timeout=90)[0] for p in procs]
    except subprocess.TimeoutExpired:  # a rank left waiting for the other is the failure this guards
        for p in procs:
            p.kill()
        raise AssertionError(f"{case}: the ranks did not finish in 90 s (a rank waits for the other)") from None
    assert all(p.returncode == 0 for p in procs), "\n".join(log[-2000:] for log in logs)
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]


def test_the_leader_generates_every_rank_rows_and_the_follower_replays_each_call(tmp_path):
    leader, follower = run_two_ranks("two_turns", tmp_path)
    # the group's rows, leader's first: [1,10], [1,20], [5,6,30]; each turn is one call on both
    # engines, with the same requests and seeds (vLLM's collectives need identical inputs)
    assert [c["prompts"] for c in leader["calls"]] == [
        [[1, 10], [1, 20], [5, 6, 30]],
        [[1, 10, 11, 12], [1, 20, 21, 22], [5, 6, 30, 31, 32, 33]]]  # each prompt + its first answer
    assert follower["calls"] == leader["calls"]
    assert len({s for c in leader["calls"] for s in c["seeds"]}) == 6  # 3 rows x 2 turns: own streams
    # each rank gets its own rows back: answers 11,12 then 13..16 for [1,10]; 31..33 then 34..39 for [5,6,30]
    # (the batch is as wide as its longest row, 3 + 6 = 9 tokens; 0 pads)
    assert leader["responses"] == [[11, 12, 13, 14, 15, 16, 0, 0, 0], [21, 22, 23, 24, 25, 26, 0, 0, 0]]
    assert follower["responses"] == [[31, 32, 33, 34, 35, 36, 37, 38, 39]]
    assert follower["response_mask"] == [[1] * 9]


def test_a_failure_on_the_leader_ends_the_follower_with_its_reason(tmp_path):
    leader, follower = run_two_ranks("leader_fails", tmp_path)
    assert leader["error"] == "ValueError: a tool's answer could not be parsed"
    assert len(leader["calls"]) == len(follower["calls"]) == 1  # the follower replayed the one call made
    assert follower["error"] == ("RuntimeError: the rollout failed on rank 0, which leads this rank's engine: "
                                 "ValueError: a tool's answer could not be parsed")


def test_only_the_leader_may_generate():
    from rlvr.rollout.vllm_rollout import SharedEngine, VLLMRollout

    class Ranks:
        is_leader = False

    rollout = VLLMRollout.__new__(VLLMRollout)
    rollout.engine = SharedEngine(llm=None, sleeps=False, ranks=Ranks())
    from rlvr.rollout.sampling import SamplingParams

    with pytest.raises(RuntimeError, match="only the first rank of an engine's group generates"):
        rollout.generate([[1, 2]], SamplingParams(max_new_tokens=2))
