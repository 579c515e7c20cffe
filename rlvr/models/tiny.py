"""A tiny randomly initialised model with the built-in model's architecture and tokenizer
(and a tiny mixture of experts, for the families whose experts transformers fuses in memory).

Tests and examples use it to run every code path in seconds: same vocabulary and chat
template as SmolLM2-135M-Instruct (a Llama), but 2 layers of width 64 (~3.3 M parameters,
almost all of them the embedding).
"""

from __future__ import annotations

from pathlib import Path

import torch

from rlvr.models.loader import load_tokenizer


def make_tiny_model(tokenizer, seed: int = 0, hidden_size: int = 64, num_hidden_layers: int = 2,
                    head_dim: int | None = None):
    """A LlamaForCausalLM with random weights (seeded) sized for ``tokenizer``. ``head_dim``
    defaults to hidden_size / 4 heads (16); vLLM's CPU attention needs 32 or more (64 as SmolLM2)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=2 * hidden_size,
        num_hidden_layers=num_hidden_layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=head_dim or hidden_size // 4,
        max_position_embeddings=2048,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    generator_state = torch.random.get_rng_state()
    torch.manual_seed(seed)
    try:
        model = LlamaForCausalLM(config)
    finally:
        torch.random.set_rng_state(generator_state)  # do not disturb the caller's RNG stream
    return model.eval()


def make_tiny_moe(tokenizer, family: str = "qwen3_moe", seed: int = 0):
    """A random mixture of experts of a published architecture, shrunk: 2 layers of width 64,
    4 experts of width 32 (top 2), 64-wide attention heads (vLLM's CPU attention). Weights are
    drawn wider than the default init so that greedy tokens depend on every expert."""
    from transformers import MixtralConfig, MixtralForCausalLM, Qwen3MoeConfig, Qwen3MoeForCausalLM

    shape = dict(vocab_size=len(tokenizer), hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, head_dim=64, num_experts_per_tok=2, max_position_embeddings=2048,
                 tie_word_embeddings=False, bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                 pad_token_id=tokenizer.pad_token_id)
    if family == "qwen3_moe":
        config = Qwen3MoeConfig(**shape, num_experts=4, moe_intermediate_size=32, norm_topk_prob=True,
                                architectures=["Qwen3MoeForCausalLM"])
        model_class = Qwen3MoeForCausalLM
    else:
        config = MixtralConfig(**shape, num_local_experts=4, intermediate_size=32, architectures=["MixtralForCausalLM"])
        model_class = MixtralForCausalLM
    state = torch.random.get_rng_state()
    torch.manual_seed(seed)
    try:
        model = model_class(config).eval()
        with torch.no_grad():
            for name, p in model.named_parameters():
                if "norm" not in name:
                    p.normal_(0, 0.2 if "experts" in name else 0.3)
    finally:
        torch.random.set_rng_state(state)
    return model




def save_tiny_model(out_dir: str | Path, tokenizer_path: str = "builtin", seed: int = 0,
                    head_dim: int | None = None) -> Path:
    """Write a tiny model + the tokenizer of ``tokenizer_path`` as a Hugging Face folder."""
    out = Path(out_dir)
    tokenizer = load_tokenizer(tokenizer_path)
    make_tiny_model(tokenizer, seed=seed, head_dim=head_dim).save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out
