"""``python vllm_moe_check.py MODEL_DIR``: vLLM's greedy tokens against transformers' on a
mixture of experts, before and after an update of its experts; prints one JSON line. Run by
``test_vllm.py`` in a fresh process (vLLM's first engine in a process decides whether it has an
expert-parallel group)."""

import json
import sys

import torch

from rlvr.config.schema import RolloutConfig
from rlvr.data import left_pad
from rlvr.models import load_model, load_tokenizer
from rlvr.rollout import SamplingParams, VLLMRollout

QUESTIONS = ["What is 2+3?", "Name a colour.", "Count to five."]


def transformers_greedy(model, tokenizer, ids, max_new_tokens, eos_ids):
    input_ids, mask, _ = left_pad(ids, tokenizer.pad_token_id)
    out = model.generate(input_ids=input_ids, attention_mask=mask, do_sample=False, max_new_tokens=max_new_tokens,
                         eos_token_id=eos_ids, pad_token_id=tokenizer.pad_token_id)[:, input_ids.shape[1]:]
    return [row[:next((i + 1 for i, t in enumerate(row) if t in eos_ids), len(row))] for row in out.tolist()]


def main(model_dir: str) -> dict:
    model, tokenizer = load_model(model_dir), load_tokenizer(model_dir)
    ids = [tokenizer.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True, tokenize=True,
                                         return_dict=False) for q in QUESTIONS]
    rollout = VLLMRollout(model, tokenizer, RolloutConfig(name="vllm", max_num_seqs=8), 32, 96)
    params = SamplingParams(max_new_tokens=12, do_sample=False)
    equal = {}
    rollout.sync_weights(version=0)
    old = transformers_greedy(model, tokenizer, ids, 12, rollout.eos_ids)
    equal["before the update"] = [c.token_ids for c in rollout.generate(ids, params)] == old
    with torch.no_grad():  # an "update" of the experts alone
        for layer in model.model.layers:
            layer.mlp.experts.down_proj.neg_()
    new = transformers_greedy(model, tokenizer, ids, 12, rollout.eos_ids)
    rollout.sync_weights(version=1)
    equal["after the update"] = [c.token_ids for c in rollout.generate(ids, params)] == new
    return {"vllm_equals_transformers": equal, "new_differs_from_old": new != old}


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1])), flush=True)
