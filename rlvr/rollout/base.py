"""The rollout engine interface and its registry (``actor_rollout_ref.rollout.name``).

As verl's ``BaseRollout`` / ``get_rollout_class``: the worker builds whichever engine the config
names and never branches on engine names. An engine answers at two levels:

- request level, ``generate(prompts, params, groups, max_new_tokens) -> list[Completion]``:
  token ids in, token ids, log-probs and a finish reason out; the multi-turn loop continues
  conversations through it without re-tokenising them;
- batch level, ``generate_sequences(prompts: DataProto) -> DataProto``: written once here over
  ``generate``, so every engine's output has the same layout (``pack_responses``).

``sync_weights(version)`` gives the engine the policy's current weights before a rollout (an
engine that shares the actor's tensors has nothing to do); ``free_cache()`` releases what it
holds for generation once the rollout is over, and ``wake_up(tags)`` takes part of it back
(vLLM's sleep mode: ``"weights"`` before the sync, ``"kv_cache"`` once the actor's state is
off the device).
"""

from __future__ import annotations

import contextlib
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import ClassVar, Hashable, Sequence

import torch

from rlvr.config.schema import RolloutConfig
from rlvr.protocol import DataProto
from rlvr.registry import Registry
from rlvr.rollout.sampling import SamplingParams


@dataclass
class Completion:
    token_ids: list[int]
    log_probs: list[float]
    finish_reason: str  # "stop" (EOS or stop string), "length" or "abort"
    weight_version: int = 0
    """The policy version the tokens came from (the engine core's, or the server's)."""
    version_starts: list[tuple[int, int]] | None = None
    """Where an in-place weight update crossed the completion: (first token, version) pairs."""
    request_id: str | None = None
    matched: int | str | None = None
    """What stopped it: the stop token id or stop string (None at EOS-free ends)."""


def end_token_ids(model, tokenizer) -> list[int]:
    """EOS ids from the generation config and the tokenizer (the chat template's end token)."""
    eos = model.generation_config.eos_token_id
    eos = eos if isinstance(eos, list) else [eos]
    return sorted({i for i in [*eos, tokenizer.eos_token_id] if i is not None})


def pack_responses(prompts: DataProto, token_ids: Sequence[Sequence[int]], log_probs: Sequence[Sequence[float]],
                   model_masks: Sequence[Sequence[int]], pad_id: int, non_tensors: dict) -> DataProto:
    """Responses right-padded next to the left-padded prompts: ``attention_mask`` is 1 on every
    response token, ``response_mask`` is ``model_masks`` (0 on tokens the model did not sample,
    such as tool output) and ``rollout_log_probs`` the sampled log-probs (0 elsewhere).
    ``meta_info["pad_token_id"]`` says the pad, so batches padded to other widths (other ranks'
    answers) can be joined to this one."""
    input_ids = prompts.batch["input_ids"]
    device = input_ids.device
    B = len(token_ids)
    width = max(1, max(len(t) for t in token_ids))
    responses = torch.full((B, width), pad_id, dtype=torch.long)
    rollout_log_probs = torch.zeros(B, width)
    response_mask = torch.zeros(B, width, dtype=torch.long)
    present = torch.zeros(B, width, dtype=torch.long)
    for r, (ids, lps, mask) in enumerate(zip(token_ids, log_probs, model_masks)):
        n = len(ids)
        responses[r, :n] = torch.tensor(ids, dtype=torch.long)
        rollout_log_probs[r, :n] = torch.tensor(lps)
        response_mask[r, :n] = torch.tensor(mask, dtype=torch.long)
        present[r, :n] = 1
    responses = responses.to(device)
    prompt_positions = prompts.batch["position_ids"]
    steps = torch.arange(1, width + 1, device=device)
    return DataProto.from_dict(
        {
            "prompts": input_ids,
            "responses": responses,
            "response_mask": response_mask.to(device),
            "input_ids": torch.cat([input_ids, responses], dim=1),
            "attention_mask": torch.cat([prompts.batch["attention_mask"], present.to(device)], dim=1),
            "position_ids": torch.cat([prompt_positions, prompt_positions[:, -1:] + steps], dim=1),
            "rollout_log_probs": rollout_log_probs.to(device),
        },
        non_tensors,
        {"pad_token_id": pad_id},
    )


class BaseRollout(ABC):
    """An engine over the policy ``model`` (a transformers causal LM whose weights it follows).
    ``max_prompt_length`` (``data.max_prompt_length``, when known) bounds the prompts it will see;
    ``device`` is the worker's device (None: the policy's)."""

    streams_weights: ClassVar[bool] = False
    """True: ``sync_weights`` reads the policy itself, sharded or not (the worker then builds no
    unsharded copy for it); False: the engine decodes on the module it is given."""

    def __init__(self, model, tokenizer, config: RolloutConfig, max_response_length: int,
                 max_prompt_length: int | None = None, device: torch.device | str | None = None):
        self.tokenizer, self.config = tokenizer, config
        self.device = torch.device(device) if device is not None else model.device  # trainer.device, resolved
        self.max_response_length = max_response_length
        self.eos_ids = end_token_ids(model, tokenizer)
        self.pad_id = tokenizer.pad_token_id

    @abstractmethod
    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams,
                 groups: Sequence[Hashable] | None = None,
                 max_new_tokens: Sequence[int] | None = None) -> list[Completion]:
        """One completion per prompt; ``groups`` keys rows that share a prompt (one prefill),
        ``max_new_tokens`` caps each row (at most ``params.max_new_tokens``)."""

    @abstractmethod
    def sync_weights(self, version: int | None = None) -> None:
        """The policy's current weights into the engine. ``version`` counts the policy's weight
        changes: an engine that already holds that version of this policy may skip the copy;
        None always copies."""

    def free_cache(self) -> None:
        """Release what generation holds once a rollout is over (default: nothing)."""

    @contextlib.contextmanager
    def turn_cache(self):
        """Inside, an engine may keep the KV cache of each completion that stopped, so that the
        next turn of its conversation (the same tokens, then the tool's) prefills only what is
        new; all of it is dropped on exit. Default: nothing kept (vLLM has its own prefix cache)."""
        yield

    def wake_up(self, tags: Sequence[str]) -> None:
        """Take back the memory of ``tags`` that ``free_cache`` released (default: nothing)."""

    def close(self) -> None:
        """The run is over: stop what the engine started (default: nothing)."""

    def generate_in_group(self, prompts: DataProto, rollout=None) -> DataProto:
        """``rollout.generate_sequences(prompts)`` (``rollout``: this engine or a loop over it, such
        as the multi-turn one), called on every rank with its own rows. An engine that spans
        several ranks (vLLM with tensor parallelism) generates the group's rows together."""
        return (rollout or self).generate_sequences(prompts)

    def generate_sequences(self, prompts: DataProto) -> DataProto:
        """Left-padded prompts (repeated n times, with ``uid``) -> responses and their masks."""
        prompts.require("input_ids", "attention_mask", "position_ids", stage="rollout")
        input_ids, attention_mask = prompts.batch["input_ids"], prompts.batch["attention_mask"]
        params = SamplingParams.from_config(self.config, self.max_response_length, prompts.meta_info)
        prompt_ids = [row[m.bool()].tolist() for row, m in zip(input_ids.cpu(), attention_mask.cpu())]
        groups = prompts.non_tensor_batch.get("uid")
        completions = self.generate(prompt_ids, params, None if groups is None else list(groups))
        return self.to_dataproto(prompts, completions)

    def to_dataproto(self, prompts: DataProto, completions: list[Completion]) -> DataProto:
        """Pack completions as right-padded response tensors next to the left-padded prompts."""
        return pack_responses(prompts, [c.token_ids for c in completions], [c.log_probs for c in completions],
                              [[1] * len(c.token_ids) for c in completions], self.pad_id,
                              {"finish_reason": [c.finish_reason for c in completions]})


ROLLOUTS: Registry = Registry("rollout engine (actor_rollout_ref.rollout.name)")
register_rollout = ROLLOUTS.register


def get_rollout_class(name: str) -> type[BaseRollout]:
    """The engine class registered as ``name``; unknown names raise with the registered ones."""
    return ROLLOUTS.get(name)
