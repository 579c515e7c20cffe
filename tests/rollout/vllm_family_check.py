"""``python vllm_family_check.py FAMILY TOKENIZER_DIR``: vLLM's greedy tokens against transformers'
on a tiny random model of ``FAMILY`` after one weight sync; prints one JSON line. Run by
``test_vllm.py`` in a fresh process (vLLM's first engine in a process decides whether it has an
expert-parallel group, and the module's engines are dense)."""

import json
import sys

import torch

from rlvr.config.schema import RolloutConfig
from rlvr.data import left_pad
from rlvr.models import load_tokenizer
from rlvr.rollout import SamplingParams, VLLMRollout

QUESTIONS = ["What is 2+3?", "Name a colour.", "Count to five."]
FAMILIES = {  # beyond the shared shape: what makes each family's case
    # the router's e_score_correction_bias is a buffer; set to values that move the routing
    "glm4_moe": dict(moe_intermediate_size=32, n_routed_experts=4, num_experts_per_tok=2, n_shared_experts=1,
                     first_k_dense_replace=1, n_group=1, topk_group=1, architectures=["Glm4MoeForCausalLM"]),
    # tied head (the family's default), which vLLM's Gemma-2 has no parameter for
    "gemma2": dict(architectures=["Gemma2ForCausalLM"]),
}


def tiny_model(family: str, tokenizer):
    from transformers import CONFIG_MAPPING, AutoModelForCausalLM

    config = CONFIG_MAPPING[family](vocab_size=len(tokenizer), hidden_size=64, intermediate_size=64,
                                    num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1, head_dim=64,
                                    max_position_embeddings=256, bos_token_id=tokenizer.bos_token_id,
                                    eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
                                    **FAMILIES[family])
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config).eval()
    with torch.no_grad():  # wider than the default init, so that greedy tokens depend on every weight
        for name, p in model.named_parameters():
            if "norm" not in name:
                p.normal_(0, 0.3)
        for name, b in model.named_buffers():
            if name.endswith("e_score_correction_bias"):
                b.copy_(torch.tensor([3.0, -3.0, 2.0, -2.0]))
    return model


def greedy(model, tokenizer, ids, eos_ids):
    input_ids, mask, _ = left_pad(ids, tokenizer.pad_token_id)
    out = model.generate(input_ids=input_ids, attention_mask=mask, do_sample=False, max_new_tokens=12,
                         eos_token_id=eos_ids, pad_token_id=tokenizer.pad_token_id)[:, input_ids.shape[1]:]
    return [row[:next((i + 1 for i, t in enumerate(row) if t in eos_ids), len(row))] for row in out.tolist()]


def main(family: str, tokenizer_dir: str) -> dict:
    tokenizer = load_tokenizer(tokenizer_dir)
    model = tiny_model(family, tokenizer)
    ids = [tokenizer.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True, tokenize=True,
                                         return_dict=False) for q in QUESTIONS]
    rollout = VLLMRollout(model, tokenizer, RolloutConfig(name="vllm", max_num_seqs=8), 32, 96)
    rollout.sync_weights(version=0)
    got = [c.token_ids for c in rollout.generate(ids, SamplingParams(max_new_tokens=12, do_sample=False))]
    return {"vllm_equals_transformers": got == greedy(model, tokenizer, ids, rollout.eos_ids)}


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1], sys.argv[2])), flush=True)
