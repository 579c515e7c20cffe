"""Rollout engines: ``generate_sequences(prompts: DataProto) -> DataProto``."""

from rlvr.rollout.hf_generate import GenerateRollout, response_mask_from_eos

__all__ = ["GenerateRollout", "response_mask_from_eos"]
