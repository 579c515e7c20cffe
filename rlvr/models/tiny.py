"""A tiny randomly initialised model with the built-in model's architecture and tokenizer.

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


def save_tiny_model(out_dir: str | Path, tokenizer_path: str = "builtin", seed: int = 0,
                    head_dim: int | None = None) -> Path:
    """Write a tiny model + the tokenizer of ``tokenizer_path`` as a Hugging Face folder."""
    out = Path(out_dir)
    tokenizer = load_tokenizer(tokenizer_path)
    make_tiny_model(tokenizer, seed=seed, head_dim=head_dim).save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out
