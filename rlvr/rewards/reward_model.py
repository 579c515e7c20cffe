"""A sequence-classification reward model from a local folder.

It scores prompt + response with its own tokenizer and chat template (the policy's token
ids are decoded and re-encoded, as verl does when the tokenizers differ). The response is read
as verl reads it, by ``attention_mask``: with tools, their output too. The score is the model's
``score`` head (that of the ``*ForSequenceClassification`` models of decoder LMs) applied at the
last token of the templated conversation; it lands in ``rm_scores`` on the response's last token
the model generated.

``add_reward_model_scores`` makes ``reward.reward_model.weight`` x that score the sample's score,
as verl's reward managers return the model's scores alone when there are any (the rule scores
stay logged); ``reward.reward_model.add_rule_scores=true`` (rlvr's) adds it to the rule score
instead. A score that is not a number (NaN, inf: a diverged or broken classifier) is handled as a
rule scorer's NaN is (``reward.on_invalid``): counted (``reward/num_invalid``, per data source,
and ``reward_model/num_invalid``) and its group left out of the update, or the step stopped.
"""

from __future__ import annotations

import dataclasses
import sys

import torch

from rlvr.config.schema import RewardConfig, RewardModelConfig
from rlvr.data.chat_template import frozen_date_kwargs
from rlvr.data.dataset import left_pad
from rlvr.protocol import DataProto
from rlvr.rewards.manager import RewardError, RewardResult, place_on_last_token


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
        if not isinstance(getattr(self.model, "score", None), torch.nn.Module):
            raise RewardError(
                f"reward model {config.path!r} ({type(self.model).__name__}) has no `score` head: rlvr applies the "
                "`score` layer of a decoder LM's *ForSequenceClassification model (Llama, Qwen2, Mistral, ...) at "
                "the conversation's last token; this model classifies otherwise (BERT: its `classifier` on the "
                "pooled first token). Use a decoder reward model (e.g. Skywork-Reward-Llama, a Qwen2 RM)")
        self.pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0

    def _conversation_ids(self, data: DataProto, i: int) -> list[int]:
        mask = data.batch["attention_mask"][i].bool()
        P = data.batch["prompts"].shape[1] if "prompts" in data.batch else data.batch["input_ids"].shape[1] - \
            data.batch["responses"].shape[1]
        # the whole response, as verl's reward model reads it: with tools, the calls and their results too
        response = self.policy_tokenizer.decode(data.batch["responses"][i][mask[P:]], skip_special_tokens=True)
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


def add_reward_model_scores(reward: RewardResult, rm_scores: torch.Tensor, config: RewardConfig,
                            sources) -> RewardResult:
    """The samples' scores with the reward model's ``rm_scores`` (bs, R): ``config.reward_model.weight`` x
    them (verl's: the model's scores alone), or ``reward`` (the rule scores) plus that with
    ``reward_model.add_rule_scores``. A sample whose model score is not a number is invalid: its
    placeholder is never trained on, because its group is dropped (``reward.on_invalid=drop``);
    ``raise`` stops the step naming it. Without the rule scores, the rule's invalid samples are not."""
    rm = config.reward_model
    rm_scores = rm_scores.to(reward.token_level_scores.device)
    bad = ~torch.isfinite(rm_scores).all(dim=-1)  # (bs,)
    rows = bad.nonzero().flatten().tolist()
    if rows and config.on_invalid == "raise":
        i = rows[0]
        raise RewardError(f"the reward model's score for sample {i} (data_source={sources[i]!r}) is not a number "
                          f"({float(rm_scores[i].sum())}); set reward.on_invalid=drop to drop its group from the "
                          "update instead, or check the reward model (reward.reward_model.path)")
    placed = rm.weight * torch.where(bad[:, None], torch.zeros_like(rm_scores), rm_scores)
    metrics = dict(reward.metrics)
    if rm.add_rule_scores:
        rule_invalid = reward.invalid if reward.invalid is not None else torch.zeros(len(bad), dtype=torch.bool)
        scores, token_level_scores = reward.scores, reward.token_level_scores + placed
    else:  # the rule's invalid samples are not trained on: nothing of theirs to drop
        rule_invalid = torch.zeros(len(bad), dtype=torch.bool)
        scores, token_level_scores = placed.sum(-1).cpu(), placed
        metrics = {k: v for k, v in metrics.items() if not k.startswith("reward/num_invalid/")}
    invalid = rule_invalid | bad.cpu()
    metrics.update({"reward_model/num_invalid": float(len(rows)), "reward/num_invalid": float(invalid.sum())})
    for i in rows:
        if not rule_invalid[i]:  # counted once, with its data source, as a rule scorer's NaN is
            key = f"reward/num_invalid/{sources[i]}"
            metrics[key] = metrics.get(key, 0.0) + 1.0
    if rows:
        print(f"[rlvr] {len(rows)} reward-model score(s) of this batch are not numbers (first: sample {rows[0]}, "
              f"data_source={sources[rows[0]]!r}): counted, and never trained on (reward.on_invalid=drop leaves "
              "their groups out of the update)", file=sys.stderr, flush=True)
    return dataclasses.replace(reward, token_level_scores=token_level_scores, metrics=metrics, scores=scores,
                               invalid=invalid)
