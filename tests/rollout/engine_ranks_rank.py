"""One rank of ``test_engine_ranks.py``: a ``VLLMRollout`` whose engine spans both ranks
(``EngineRanks(2)``), over a recording stand-in for vLLM's ``LLM`` (what ``generate`` was asked,
in order), driven through ``generate_in_group`` by a two-turn loop, as the multi-turn rollout
drives the engine. ``python engine_ranks_rank.py CASE OUT_DIR`` (RANK, WORLD_SIZE, MASTER_* set).

Cases: ``two_turns`` (each rank's own rows, the leader generating twice), ``leader_fails`` (the
leader's loop raises after its first generate: the follower must raise too, not wait forever)."""

import json
import os
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import torch
import torch.distributed as dist

from rlvr.protocol import DataProto
from rlvr.rollout.base import pack_responses
from rlvr.rollout.sampling import SamplingParams
from rlvr.rollout.vllm_rollout import EngineRanks, SharedEngine, VLLMRollout


class RecordingLLM:
    """vLLM's ``LLM.generate`` as far as the rollout reads it: the answer to a prompt is its last
    token + 1, + 2, ... (one token per prompt token), each with log-prob -0.5."""

    def __init__(self):
        self.calls = []

    def generate(self, requests, sampling, use_tqdm=False):
        prompts = [list(r["prompt_token_ids"]) for r in requests]
        self.calls.append({"prompts": prompts, "seeds": [s.seed for s in sampling]})
        outs = []
        for p in prompts:
            ids = [p[-1] + k for k in range(1, len(p) + 1)]
            logprobs = [{t: SimpleNamespace(logprob=-0.5)} for t in ids]
            outs.append(SimpleNamespace(outputs=[SimpleNamespace(token_ids=ids, logprobs=logprobs,
                                                                 finish_reason="stop")]))
        return outs


class TwoTurns:
    """A loop over the engine (as ``MultiTurnRollout``): each row is generated, then generated
    again after its first answer; ``fail`` raises between the turns."""

    def __init__(self, engine, fail: bool):
        self.engine, self.fail = engine, fail

    def generate_sequences(self, prompts: DataProto) -> DataProto:
        rows = [r[m.bool()].tolist() for r, m in zip(prompts.batch["input_ids"], prompts.batch["attention_mask"])]
        params = SamplingParams(temperature=1.0, max_new_tokens=8, seed=7, row_offset=prompts.meta_info["row_offset"])
        first = self.engine.generate(rows, params)
        if self.fail:
            raise ValueError("a tool's answer could not be parsed")
        second = self.engine.generate([r + c.token_ids for r, c in zip(rows, first)], params)
        ids = [a.token_ids + b.token_ids for a, b in zip(first, second)]
        return pack_responses(prompts, ids, [[-0.5] * len(i) for i in ids], [[1] * len(i) for i in ids], 0,
                              {"finish_reason": np.array(["stop"] * len(ids), dtype=object)})


def main(case: str, out_dir: str) -> None:
    rank = int(os.environ["RANK"])
    dist.init_process_group("gloo", rank=rank, world_size=int(os.environ["WORLD_SIZE"]))
    llm = RecordingLLM()
    rollout = VLLMRollout.__new__(VLLMRollout)  # no vLLM: the engine is the stand-in
    rollout.engine, rollout.serial, rollout.max_model_len, rollout.eos_ids = \
        SharedEngine(llm, sleeps=False, ranks=EngineRanks(2)), 0, 64, [0]
    rollout.engine.holds = (0, 0)
    # each rank's own rows: rank 0 two prompts ending in 10 and 20, rank 1 one ending in 30 (uneven)
    prompts = [[1, 10], [1, 20]] if rank == 0 else [[5, 6, 30]]
    width = 3
    ids = torch.tensor([[0] * (width - len(p)) + p for p in prompts])
    mask = (torch.arange(width)[None] >= torch.tensor([width - len(p) for p in prompts])[:, None]).long()
    batch = DataProto.from_dict({"input_ids": ids, "attention_mask": mask, "position_ids": mask.cumsum(1)},
                                meta_info={"row_offset": 0 if rank == 0 else 2})
    result = {"rank": rank}
    try:
        out = rollout.generate_in_group(batch, TwoTurns(rollout, fail=case == "leader_fails"))
        result["responses"] = out.batch["responses"].tolist()
        result["response_mask"] = out.batch["response_mask"].tolist()
    except Exception as error:  # noqa: BLE001 - the case under test
        result["error"] = f"{type(error).__name__}: {error}"
    result["calls"] = llm.calls
    Path(out_dir, f"rank{rank}.json").write_text(json.dumps(result))
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
