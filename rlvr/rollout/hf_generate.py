"""The reference rollout: transformers' ``model.generate`` behind rlvr's rollout interface.

It is correct and simple, and it is the baseline the native engine is measured against
(``bench/rollout.py``). Sampling settings come from ``RolloutConfig`` and can be overridden
per call through ``meta_info`` (``do_sample``, ``temperature``, ``top_p``, ``top_k``,
``max_new_tokens``, ``seed``).
"""

from __future__ import annotations

import torch

from rlvr.config.schema import RolloutConfig
from rlvr.protocol import DataProto


def response_mask_from_eos(responses: torch.Tensor, eos_ids: list[int]) -> torch.Tensor:
    """1 up to and including each row's first EOS token, 0 after it.  (B, R) -> (B, R) long."""
    is_eos = torch.isin(responses, torch.tensor(eos_ids, device=responses.device))
    after_eos = (is_eos.long().cumsum(dim=1) - is_eos.long()) > 0  # strictly after the first EOS
    return (~after_eos).long()


class GenerateRollout:
    """Generates responses for a left-padded prompt batch with ``model.generate``."""

    def __init__(self, model, tokenizer, config: RolloutConfig, max_response_length: int):
        self.model, self.tokenizer, self.config = model, tokenizer, config
        self.max_response_length = max_response_length
        from rlvr.rollout.base import end_token_ids

        self.eos_ids = end_token_ids(model, tokenizer)

    def _sampling(self, meta: dict) -> dict:
        c = self.config
        do_sample = meta.get("do_sample", c.do_sample)
        temperature = meta.get("temperature", c.temperature)
        if not do_sample or temperature == 0:
            return {"do_sample": False, "temperature": 1.0, "top_p": 1.0, "top_k": None}
        top_k = meta.get("top_k", c.top_k)
        return {"do_sample": True, "temperature": temperature, "top_p": meta.get("top_p", c.top_p),
                "top_k": None if top_k is None or top_k < 0 else top_k}

    @torch.no_grad()
    def generate_sequences(self, prompts: DataProto) -> DataProto:
        prompts.require("input_ids", "attention_mask", "position_ids", stage="rollout")
        meta = prompts.meta_info
        sampling = self._sampling(meta)
        input_ids, attention_mask = prompts.batch["input_ids"], prompts.batch["attention_mask"]
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(meta.get("seed", self.config.seed))
            out = self.model.generate(
                input_ids=input_ids, attention_mask=attention_mask,
                max_new_tokens=meta.get("max_new_tokens", self.max_response_length),
                eos_token_id=self.eos_ids, pad_token_id=self.tokenizer.pad_token_id,
                output_logits=True, return_dict_in_generate=True, **sampling,
            )
        prompt_len = input_ids.shape[1]
        responses = out.sequences[:, prompt_len:]  # (B, R)
        response_mask = response_mask_from_eos(responses, self.eos_ids)
        logits = torch.stack(out.logits, dim=1).float() / sampling["temperature"]  # (B, R, V)
        log_probs = torch.log_softmax(logits, dim=-1).gather(-1, responses.unsqueeze(-1)).squeeze(-1)
        prompt_positions = prompts.batch["position_ids"]  # (B, P)
        steps = torch.arange(1, responses.shape[1] + 1, device=responses.device)
        return DataProto.from_dict(
            {
                "prompts": input_ids,
                "responses": responses,
                "response_mask": response_mask,
                "input_ids": out.sequences,
                "attention_mask": torch.cat([attention_mask, response_mask], dim=1),
                "position_ids": torch.cat([prompt_positions, prompt_positions[:, -1:] + steps], dim=1),
                "rollout_log_probs": log_probs * response_mask,
            },
            meta_info={"sampling": sampling, "pad_token_id": self.tokenizer.pad_token_id},
        )
