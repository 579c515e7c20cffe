"""vLLM's CPU build runs one engine over 2 ranks (``tensor_parallel_size=2`` with the
``external_launcher`` executor, one process per rank, as verl's hybrid engine starts it).

rlvr refuses ``rollout.tensor_model_parallel_size > 1`` at train time because its vLLM rollout is
not built for it (``rlvr.config.validate._not_trainable``); this test keeps the other half of
that message true: the engine itself is not what stands in the way, on this CPU either.
"""

import json
import subprocess
import sys

import pytest
import torch

from rlvr.distributed.worker import free_port
from rlvr.models import load_model

pytestmark = pytest.mark.slow  # vLLM is installed by make setup (requirements/lock-cpu.txt): no skip

PROMPTS = [[1, 504, 314, 216, 1000], [1, 2000, 30, 7]]  # token ids (no tokenizer choices in between)
NEW_TOKENS = 8
GREEDY_TP2 = """
import json, os, sys
os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
from vllm import LLM, SamplingParams
folder, prompts, out_dir = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3]
llm = LLM(model=folder, tokenizer=folder, tensor_parallel_size=2, distributed_executor_backend="external_launcher",
          enforce_eager=True, dtype="float32", kv_cache_memory_bytes=64 * 2**20, max_model_len=128, seed=0)
params = SamplingParams(temperature=0, max_tokens=%d, ignore_eos=True)
out = llm.generate([{"prompt_token_ids": ids} for ids in prompts], params)
with open(os.path.join(out_dir, "rank%%s.json" %% os.environ["RANK"]), "w") as f:
    json.dump([list(o.outputs[0].token_ids) for o in out], f)
""" % NEW_TOKENS


def transformers_greedy(model_dir) -> list[list[int]]:
    model = load_model(model_dir)
    out = []
    for ids in PROMPTS:
        generated = model.generate(torch.tensor([ids]), do_sample=False, max_new_tokens=NEW_TOKENS,
                                   min_new_tokens=NEW_TOKENS, pad_token_id=0)
        out.append(generated[0, len(ids):].tolist())
    return out


def test_vllm_cpu_engine_spans_two_ranks_with_the_external_launcher(tmp_path, tiny_vllm_model_dir):
    script = tmp_path / "greedy_tp2.py"
    script.write_text(GREEDY_TP2)
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2",
                           "--master_addr=127.0.0.1", f"--master_port={free_port()}", str(script),
                           str(tiny_vllm_model_dir), json.dumps(PROMPTS), str(tmp_path)],
                          capture_output=True, text=True, timeout=400)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    expected = transformers_greedy(tiny_vllm_model_dir)
    for rank in (0, 1):  # each rank returns the whole batch: the one-device model's greedy tokens
        assert json.loads((tmp_path / f"rank{rank}.json").read_text()) == expected
