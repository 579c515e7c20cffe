"""Rollout engines: ``generate_sequences(prompts: DataProto) -> DataProto``.

``NativeRollout`` is rlvr's engine; ``MultiTurnRollout`` drives it through tool-calling
turns (``multi_turn.enable``); ``GenerateRollout`` wraps transformers' ``generate`` and is
the reference the engine is tested and benchmarked against.
"""

from rlvr.rollout.engine import Completion, NativeRollout, end_token_ids
from rlvr.rollout.hf_generate import GenerateRollout, response_mask_from_eos
from rlvr.rollout.multi_turn import MultiTurnRollout, Request, RequestState, ToolSetup
from rlvr.rollout.sampling import SamplingParams, filter_probs, sample_tokens



def build_rollout(model, tokenizer, config, max_response_length: int, tool_setup: "ToolSetup | None" = None):
    """The engine named by ``actor_rollout_ref.rollout.name``, driven by the multi-turn tool loop
    when ``multi_turn.enable`` (its tools from ``tool_setup``, else read from the config)."""
    if config.name == "native":
        engine = NativeRollout(model, tokenizer, config, max_response_length)
        if not config.multi_turn.enable:
            return engine
        setup = tool_setup or ToolSetup.from_config(tokenizer, config)
        return MultiTurnRollout(engine, setup.tools, config.multi_turn, setup.chat, max_response_length)
    raise ValueError(
        f"actor_rollout_ref.rollout.name={config.name!r} is not available; rlvr ships the 'native' engine "
        "(a vLLM engine can implement the same generate_sequences interface)"
    )


__all__ = ["build_rollout", "Completion", "GenerateRollout", "MultiTurnRollout", "NativeRollout", "Request",
           "RequestState", "ToolSetup", "SamplingParams", "end_token_ids", "filter_probs",
           "response_mask_from_eos", "sample_tokens"]
