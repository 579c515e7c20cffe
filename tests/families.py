"""Tiny random-weight models of the families users train, for tests that must hold on each.

Each entry is a transformers config (2 layers, hidden 32, vocabulary 128) chosen to put the
family's particularity in play on short test sequences: sliding windows of 4 tokens (shorter
than the 10-20 token rows the tests use), logit transforms strong enough to move a log-prob
(Cohere's scale 4, Granite's divisor 8, Gemma-2's soft-cap at 3). ``FAMILIES`` maps a row name to
a function that builds the config; ``tiny_model(name)`` builds the model in fp32 with SDPA
attention, seeded, in eval mode. Import them from other tests:
``from tests.families import FAMILIES, tiny_model``.
"""

from __future__ import annotations

import torch
import transformers as tf

VOCAB = 128
WINDOW = 4  # sliding window, shorter than every test sequence
COMMON = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, head_dim=8, max_position_embeddings=256, pad_token_id=0, bos_token_id=2,
              eos_token_id=1, tie_word_embeddings=False)
MOE = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32)
ALTERNATING = ["sliding_attention", "full_attention"]


def _config(cls, **kw):
    return cls(**{**COMMON, **kw})


FAMILIES = {
    "qwen2": lambda: _config(tf.Qwen2Config),
    "qwen3": lambda: _config(tf.Qwen3Config),
    "llama3": lambda: _config(tf.LlamaConfig, rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0,
                                                                 "factor": 8.0, "low_freq_factor": 1.0,
                                                                 "high_freq_factor": 4.0,
                                                                 "original_max_position_embeddings": 64}),
    "mistral": lambda: _config(tf.MistralConfig, sliding_window=None),
    "mistral-window": lambda: _config(tf.MistralConfig, sliding_window=WINDOW),
    "phi3": lambda: _config(tf.Phi3Config, sliding_window=None),
    "phi4-mini": lambda: _config(tf.Phi3Config, partial_rotary_factor=0.75, tie_word_embeddings=True,
                                 sliding_window=None),
    "smollm3": lambda: _config(tf.SmolLM3Config, no_rope_layer_interval=2),
    "olmo2": lambda: _config(tf.Olmo2Config),
    "olmo3": lambda: _config(tf.Olmo3Config, sliding_window=WINDOW, layer_types=ALTERNATING),
    "mixtral": lambda: _config(tf.MixtralConfig, num_local_experts=4, num_experts_per_tok=2),
    "qwen3-moe": lambda: _config(tf.Qwen3MoeConfig, **MOE, decoder_sparse_step=1),
    "deepseek-v3": lambda: _config(tf.DeepseekV3Config, n_routed_experts=4, num_experts_per_tok=2, n_group=1,
                                   topk_group=1, moe_intermediate_size=32, first_k_dense_replace=1, q_lora_rank=16,
                                   kv_lora_rank=16, head_dim=4, qk_rope_head_dim=4, qk_nope_head_dim=4,
                                   v_head_dim=8, n_shared_experts=1, num_key_value_heads=4),  # MLA: kv heads = heads;
    # rotary runs on head_dim, the rope part
    "glm4-moe": lambda: _config(tf.Glm4MoeConfig, n_routed_experts=4, num_experts_per_tok=2, n_group=1,
                                topk_group=1, moe_intermediate_size=32, first_k_dense_replace=1, n_shared_experts=1),
    "cohere": lambda: _config(tf.CohereConfig, logit_scale=4.0),
    "cohere2": lambda: _config(tf.Cohere2Config, logit_scale=4.0, sliding_window=WINDOW, layer_types=ALTERNATING),
    "granite": lambda: _config(tf.GraniteConfig, logits_scaling=8.0),
    "granitemoe": lambda: _config(tf.GraniteMoeConfig, logits_scaling=8.0, num_local_experts=4,
                                  num_experts_per_tok=2),
    "gemma2-softcap": lambda: _config(tf.Gemma2Config, final_logit_softcapping=3.0, sliding_window=4096),
    "gemma2-window": lambda: _config(tf.Gemma2Config, final_logit_softcapping=None, sliding_window=WINDOW),
    "gemma3": lambda: _config(tf.Gemma3TextConfig, sliding_window=WINDOW, layer_types=ALTERNATING,
                              final_logit_softcapping=3.0),
    "gemma4": lambda: _config(tf.Gemma4TextConfig, sliding_window=WINDOW, layer_types=ALTERNATING,
                              final_logit_softcapping=3.0, global_head_dim=8, hidden_size_per_layer_input=8,
                              vocab_size_per_layer_input=VOCAB, num_kv_shared_layers=0),
    "qwen3.5": lambda: _config(tf.Qwen3_5TextConfig, layer_types=["linear_attention", "full_attention"],
                               linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=8,
                               linear_value_head_dim=8),
    "falcon-h1": lambda: _config(tf.FalconH1Config, mamba_d_ssm=32, mamba_n_heads=4, mamba_d_head=8, mamba_n_groups=1,
                                 mamba_d_state=8, mamba_chunk_size=8, lm_head_multiplier=4.0),
    "gpt-oss": lambda: _config(tf.GptOssConfig, num_local_experts=4, num_experts_per_tok=2, sliding_window=WINDOW,
                               layer_types=ALTERNATING),
}

# families that rlvr refuses at load, and the start of the refusal (the family, then the reason)
REFUSED = {"gpt-oss": "gpt_oss model, which rlvr does not support: transformers has no SDPA attention"}


def tiny_model(name: str, seed: int = 0):
    """The tiny ``name`` model: fp32, SDPA attention, eval mode, weights drawn from ``seed``.

    Weights are re-drawn from N(0, 0.2) (larger than the 0.02 of ``init_weights``) so that attention
    is far from uniform and a lost window or a missed logit transform moves the log-probs."""
    config = FAMILIES[name]()
    config._attn_implementation = "sdpa"
    torch.manual_seed(seed)
    model = tf.AutoModelForCausalLM.from_config(config, attn_implementation="sdpa", dtype=torch.float32)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() >= 2:
                p.normal_(0.0, 0.2)
    return model.eval()
