"""A sequence-classification reward model from a local folder.

It scores prompt + response with its own tokenizer and chat template (the policy's token
ids are decoded and re-encoded, as verl does when the tokenizers differ). The score is the
classification head applied at the last token of the templated conversation; it lands in
``rm_scores`` on the response's last valid token.
"""

from __future__ import annotations

import torch

from rlvr.config.schema import RewardModelConfig
from rlvr.data.chat_template import frozen_date_kwargs
from rlvr.data.dataset import left_pad
from rlvr.protocol import DataProto
from rlvr.rewards.manager import RewardError, place_on_last_token


class RewardModel:
    def __init__(self, config: RewardModelConfig, policy_tokenizer, device: str = "cpu"):
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        from rlvr.models.loader import model_folder

        if not config.path:
            raise RewardError("reward.reward_model.enable is true but reward.reward_model.path is not set")
        folder = model_folder(config.path)
        self.config, self.policy_tokenizer = config, policy_tokenizer
        self.tokenizer = AutoTokenizer.from_pretrained(folder)
        self.model = AutoModelForSequenceClassification.from_pretrained(folder, dtype=torch.float32).to(device).eval()
        if self.model.config.num_labels != 1:
            raise RewardError(f"reward model {config.path!r} has num_labels={self.model.config.num_labels}; need 1")
        self.pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0

    def _conversation_ids(self, data: DataProto, i: int) -> list[int]:
        mask = data.batch["attention_mask"][i].bool()
        P = data.batch["prompts"].shape[1] if "prompts" in data.batch else data.batch["input_ids"].shape[1] - \
            data.batch["responses"].shape[1]
        response = self.policy_tokenizer.decode(
            data.batch["responses"][i][data.batch["response_mask"][i].bool()], skip_special_tokens=True)
        raw = data.non_tensor_batch.get("raw_prompt")
        if raw is not None:
            messages = list(raw[i])
        else:
            prompt = self.policy_tokenizer.decode(data.batch["input_ids"][i, :P][mask[:P]], skip_special_tokens=True)
            messages = [{"role": "user", "content": prompt}]
        messages = messages + [{"role": "assistant", "content": response}]
        if self.tokenizer.chat_template:
            text = self.tokenizer.apply_chat_template(messages, tokenize=False, **frozen_date_kwargs())
        else:
            text = "\n".join(m["content"] for m in messages)
        return self.tokenizer.encode(text, add_special_tokens=False)

    @torch.no_grad()
    def scores(self, data: DataProto) -> torch.Tensor:
        """(bs,) reward-model scores, computed in micro-batches."""
        out = []
        for start in range(0, len(data), self.config.micro_batch_size_per_gpu):
            rows = range(start, min(start + self.config.micro_batch_size_per_gpu, len(data)))
            input_ids, mask, positions = left_pad([self._conversation_ids(data, i) for i in rows], self.pad_id)
            device = self.model.device
            backbone = getattr(self.model, self.model.base_model_prefix)
            hidden = backbone(input_ids=input_ids.to(device), attention_mask=mask.to(device),
                              position_ids=positions.to(device)).last_hidden_state  # (b, L, H)
            # left-padded: every conversation ends at the last column, whatever the pad id is
            out.append(self.model.score(hidden[:, -1]).squeeze(-1).float().cpu())
        return torch.cat(out)

    def compute_rm_score(self, data: DataProto) -> DataProto:
        data.require("responses", "response_mask", "input_ids", "attention_mask", stage="reward model")
        scores = self.scores(data)
        return DataProto.from_dict({"rm_scores": place_on_last_token(scores, data.batch["response_mask"].cpu())})
