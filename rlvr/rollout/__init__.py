"""Rollout engines: ``generate_sequences(prompts: DataProto) -> DataProto``.

``NativeRollout`` is rlvr's engine; ``GenerateRollout`` wraps transformers' ``generate``
and is the reference the engine is tested and benchmarked against.
"""

from rlvr.rollout.engine import Completion, NativeRollout, end_token_ids
from rlvr.rollout.hf_generate import GenerateRollout, response_mask_from_eos
from rlvr.rollout.sampling import SamplingParams, filter_probs, sample_tokens



def build_rollout(model, tokenizer, config, max_response_length: int) -> NativeRollout:
    """The engine named by ``actor_rollout_ref.rollout.name``."""
    if config.name == "native":
        return NativeRollout(model, tokenizer, config, max_response_length)
    raise ValueError(
        f"actor_rollout_ref.rollout.name={config.name!r} is not available; rlvr ships the 'native' engine "
        "(a vLLM engine can implement the same generate_sequences interface)"
    )


__all__ = ["build_rollout", "Completion", "GenerateRollout", "NativeRollout", "SamplingParams", "end_token_ids", "filter_probs",
           "response_mask_from_eos", "sample_tokens"]
