"""Rollout engines behind one registry (``actor_rollout_ref.rollout.name``): each has
``generate`` (requests) and ``generate_sequences(prompts: DataProto) -> DataProto`` (the batch).

``NativeRollout`` (``native``) is rlvr's engine; ``VLLMRollout`` (``vllm``) runs vLLM in the
training process; ``MultiTurnRollout`` drives either through tool-calling turns
(``multi_turn.enable``); ``GenerateRollout`` wraps transformers' ``generate`` and is the
reference the engines are tested and benchmarked against.
"""

from rlvr.rollout.base import BaseRollout, Completion, end_token_ids, get_rollout_class, register_rollout
from rlvr.rollout.engine import NativeRollout
from rlvr.rollout.hf_generate import GenerateRollout, response_mask_from_eos
from rlvr.rollout.multi_turn import MultiTurnRollout, Request, RequestState, ToolSetup
from rlvr.rollout.sampling import SamplingParams, filter_probs, sample_tokens
from rlvr.rollout.vllm_rollout import VLLMRollout


def build_rollout(model, tokenizer, config, max_response_length: int, tool_setup: "ToolSetup | None" = None,
                  max_prompt_length: int | None = None, device=None, log_dir=None, template_kwargs=None,
                  model_cfg=None):
    """The engine named by ``actor_rollout_ref.rollout.name`` over ``model`` on ``device`` (the
    worker's, from ``trainer.device``; None: the model's), or with ``rollout.mode=async`` the
    servers of that protocol (``servers.py``; their logs in ``log_dir``), driven by the multi-turn tool loop when
    ``multi_turn.enable`` (its tools from ``tool_setup``, else read from the config, its turns rendered
    with ``template_kwargs``: ``data.apply_chat_template_kwargs``). ``model_cfg``
    (``actor_rollout_ref.model``): how server replicas load the policy, as the actor does."""
    if config.mode == "async":
        from rlvr.rollout.servers import ServerRollout

        engine = ServerRollout(model, tokenizer, config, max_response_length, max_prompt_length, device,
                               log_dir=log_dir, model_cfg=model_cfg)
    else:
        engine = get_rollout_class(config.name)(model, tokenizer, config, max_response_length, max_prompt_length,
                                                device)
    if not config.multi_turn.enable:
        return engine
    setup = tool_setup or ToolSetup.from_config(tokenizer, config, template_kwargs)
    return MultiTurnRollout(engine, setup.tools, config.multi_turn, setup.chat, max_response_length)


def streams_weights(config) -> bool:
    """Whether the rollout of ``config`` reads the policy itself, sharded or not (vLLM, rollout
    servers): the worker then builds no unsharded copy for it."""
    return config.mode == "async" or get_rollout_class(config.name).streams_weights


__all__ = ["build_rollout", "streams_weights", "BaseRollout", "Completion", "GenerateRollout", "MultiTurnRollout", "NativeRollout",
           "Request", "RequestState", "ToolSetup", "SamplingParams", "VLLMRollout", "end_token_ids", "filter_probs",
           "get_rollout_class", "register_rollout", "response_mask_from_eos", "sample_tokens"]
