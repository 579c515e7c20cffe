"""RLHFDataset: prompts in verl's row format, tokenised with the chat template.

A row (parquet or JSONL) looks like::

    {"data_source": "arithmetic",
     "prompt": [{"role": "user", "content": "What is 3 + 4? ..."}],
     "ability": "math",
     "reward_model": {"style": "rule", "ground_truth": "7"},
     "extra_info": {"index": 0, "split": "train"}}

Every row is checked and tokenised once, when the dataset is built, so a malformed row
fails before training starts, with the file, row and key in the message.

Departures from verl: ``__getitem__`` returns the unpadded prompt and ``collate`` left-pads
each batch to its own longest prompt (not always to ``max_prompt_length``): the rollout and
log-prob passes then do no work on padding columns.
"""

from __future__ import annotations

import difflib
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch

from rlvr.config.schema import DataConfig
from rlvr.data.chat_template import TEMPLATE_ARGUMENTS, ChatFormat, frozen_date_kwargs, template_variables
from rlvr.data.io import DatasetError, read_numbered_rows
from rlvr.protocol import DataProto


TOOLS_KWARGS_KEYS = {"create_kwargs", "execute_kwargs", "calc_reward_kwargs", "release_kwargs"}


@dataclass(frozen=True)
class RowOrigin:
    file: str
    where: str  # "row 3" (parquet, from 0) or "line 4" (JSONL, as an editor counts)

    def __str__(self) -> str:
        return f"{self.file}, {self.where}"


CHAT_ROLES = ("system", "user", "assistant", "tool", "developer")


def validate_row(row: dict[str, Any], origin: RowOrigin, prompt_key: str = "prompt",
                 reward_fn_key: str = "data_source") -> None:
    """Raise DatasetError naming the file, row and key if ``row`` is not in verl's format."""

    def fail(key: str, problem: str) -> DatasetError:
        return DatasetError(f"{origin}: key {key!r} {problem}")

    if reward_fn_key not in row or not isinstance(row[reward_fn_key], str) or not row[reward_fn_key]:
        raise fail(reward_fn_key, "is missing or not a non-empty string (it selects the reward function)")
    if prompt_key not in row:
        raise fail(prompt_key, f"is missing (the row has {sorted(row)})")
    messages = row[prompt_key]
    if isinstance(messages, np.ndarray):
        messages = messages.tolist()
    if not isinstance(messages, list) or not messages:
        raise fail(prompt_key, "must be a non-empty list of chat messages [{'role': ..., 'content': ...}]")
    for i, msg in enumerate(messages):
        if not isinstance(msg, dict) or not isinstance(msg.get("role"), str) or not isinstance(msg.get("content"), str):
            raise fail(f"{prompt_key}[{i}]", "must be a dict with string 'role' and 'content'")
        if msg["role"] not in CHAT_ROLES:  # a template renders any string as a role: the model would see 'usr'
            near = difflib.get_close_matches(msg["role"].lower(), CHAT_ROLES, n=1, cutoff=0.5)
            raise fail(f"{prompt_key}[{i}].role", f"is {msg['role']!r}, not a chat role ({', '.join(CHAT_ROLES)})"
                       + (f"; did you mean {near[0]!r}?" if near else ""))
    if not any(m["content"].strip() for m in messages):
        raise fail(prompt_key, "has only empty message contents")
    if messages[-1]["role"] == "assistant":  # the template would open a second assistant turn after it
        raise fail(f"{prompt_key}[{len(messages) - 1}].role",
                   "is 'assistant', the prompt's last message: the model would answer after its own answer; "
                   "end the prompt with the user's (or tool's) message and put the answer in reward_model.ground_truth")
    if "tools_kwargs" in row and row["tools_kwargs"] is not None:
        raise fail("tools_kwargs", "is a column of its own; rlvr (as verl) reads a row's tool arguments from "
                   "extra_info.tools_kwargs: move it there")
    for key in ("reward_model", "extra_info"):
        if key in row and row[key] is not None and not isinstance(row[key], dict):
            raise fail(key, f"must be a dict, got {type(row[key]).__name__}")
    tools_kwargs = (row.get("extra_info") or {}).get("tools_kwargs")
    if tools_kwargs is not None:
        if not isinstance(tools_kwargs, dict):
            raise fail("extra_info.tools_kwargs", "must map tool names to {create_kwargs: ..., execute_kwargs: ...}")
        for tool, kw in tools_kwargs.items():
            if kw is None:
                continue
            bad = set(kw) - TOOLS_KWARGS_KEYS if isinstance(kw, dict) else {"(not a mapping)"}
            if bad:
                raise fail(f"extra_info.tools_kwargs.{tool}", f"has keys {sorted(bad)}; allowed: {sorted(TOOLS_KWARGS_KEYS)}")


def truncate_ids(ids: list[int], max_length: int, mode: str, origin: RowOrigin | None = None) -> list[int]:
    """Cut ``ids`` to ``max_length`` keeping the left, right or both ends, or raise for ``error``."""
    if len(ids) <= max_length:
        return ids
    if mode == "left":  # keep the end of the prompt (the question usually comes last)
        return ids[-max_length:]
    if mode == "right":
        return ids[:max_length]
    if mode == "middle":
        head = max_length // 2
        return ids[:head] + ids[len(ids) - (max_length - head):]
    raise DatasetError(
        f"{origin or 'prompt'}: prompt has {len(ids)} tokens, more than data.max_prompt_length={max_length}; "
        "raise max_prompt_length, set data.filter_overlong_prompts=true, or choose "
        "data.truncation=left|right|middle"
    )


class RLHFDataset:
    """Prompts from one or more files, checked, templated and tokenised at construction."""

    def __init__(self, files: str | Path | Sequence[str | Path], tokenizer, config: DataConfig | None = None,
                 chat: ChatFormat | None = None):
        self.config = config or DataConfig()
        self.tokenizer = tokenizer
        self.chat = chat  # with tools: the format that lists them in the prompt
        files = [files] if isinstance(files, (str, Path)) else list(files)
        if not files:
            raise DatasetError("no dataset files given (data.train_files / data.val_files is empty)")
        self.rows: list[dict[str, Any]] = []
        self.origins: list[RowOrigin] = []
        for file in files:
            for where, row in read_numbered_rows(file):
                origin = RowOrigin(str(file), where)
                validate_row(row, origin, self.config.prompt_key, self.config.reward_fn_key)
                self.rows.append(row)
                self.origins.append(origin)
        if not self.rows:
            raise DatasetError(f"dataset files {[str(f) for f in files]} hold no rows")
        self._check_template_kwargs()
        self.prompt_ids = [self._tokenize(row, origin) for row, origin in zip(self.rows, self.origins)]
        self.num_filtered = 0
        self.num_rows_read = len(self.rows)
        self.longest_filtered = 0  # tokens of the longest prompt filtered out
        if self.config.filter_overlong_prompts:
            keep = [i for i, ids in enumerate(self.prompt_ids) if len(ids) <= self.config.max_prompt_length]
            self.num_filtered = len(self.rows) - len(keep)
            self.longest_filtered = max((len(ids) for ids in self.prompt_ids), default=0) if self.num_filtered else 0
            self.rows = [self.rows[i] for i in keep]
            self.origins = [self.origins[i] for i in keep]
            self.prompt_ids = [self.prompt_ids[i] for i in keep]
            if not self.rows:
                raise DatasetError(
                    f"every prompt in {[str(f) for f in files]} is longer than data.max_prompt_length="
                    f"{self.config.max_prompt_length} tokens; raise it"
                )
        elif self.config.truncation == "error":  # now, not at the step that first samples the row
            for ids, origin in zip(self.prompt_ids, self.origins):
                truncate_ids(ids, self.config.max_prompt_length, "error", origin)

    def filter_report(self, split: str) -> str | None:
        """What loading dropped, in a sentence (None: nothing)."""
        if not self.num_filtered:
            return None
        return (f"{split}: {self.num_filtered} of {self.num_rows_read} rows dropped: their prompt is longer than "
                f"data.max_prompt_length={self.config.max_prompt_length} tokens (the longest has "
                f"{self.longest_filtered}; data.filter_overlong_prompts=true); {len(self.rows)} rows remain")

    def say_filtered(self, split: str) -> None:
        """Print ``filter_report`` to stderr, if anything was dropped: a score over the rest is not the split's."""
        report = self.filter_report(split)
        if report:
            print(f"[rlvr] {report}", file=sys.stderr, flush=True)

    def _check_template_kwargs(self) -> None:
        """Each of ``data.apply_chat_template_kwargs`` is a variable the template that renders the
        prompts reads (jinja ignores any other name: a misspelled ``enable_thinking`` changed nothing)."""
        kwargs, key = self.config.apply_chat_template_kwargs, "data.apply_chat_template_kwargs"
        if not kwargs:
            return
        if self.chat is None and not self.config.apply_chat_template:
            raise DatasetError(f"{key} = {dict(kwargs)} has no effect with data.apply_chat_template=false (the "
                               "messages are joined as plain text): drop it, or apply the template")
        template = self.chat.template if self.chat is not None else None
        read = template_variables(self.tokenizer, template) - set(TEMPLATE_ARGUMENTS)
        for name in kwargs:
            if name not in read:
                close = difflib.get_close_matches(name, sorted(read), n=1)
                raise DatasetError(f"{key}.{name}: the chat template reads no variable of that name, so it would "
                                   f"change nothing" + (f"; did you mean {close[0]}?" if close else "") +
                                   f" (the template reads {', '.join(sorted(read)) or 'none'})")

    def _prompt_text(self, row: dict[str, Any]) -> str:
        messages = list(row[self.config.prompt_key])
        if self.chat is not None:
            return self.chat.render(messages, add_generation_prompt=True)
        if self.config.apply_chat_template:
            return self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False,
                                                      **self.config.apply_chat_template_kwargs, **frozen_date_kwargs())
        return "\n".join(m["content"] for m in messages)

    def _tokenize(self, row: dict[str, Any], origin: RowOrigin) -> list[int]:
        try:
            text = self._prompt_text(row)
            ids = self.tokenizer.encode(text, add_special_tokens=False)
        except Exception as err:  # the template's own refusal (jinja's raise_exception), no template, bad text
            hint = ""
            if self.chat is None and self.config.apply_chat_template and not getattr(self.tokenizer, "chat_template",
                                                                                      None):
                hint = ("; the tokenizer has no chat template (a base model?): set data.apply_chat_template=false "
                        "to join the messages' contents as plain text")
            raise DatasetError(f"{origin}: key {self.config.prompt_key!r} could not be rendered and tokenised "
                               f"({type(err).__name__}: {err}){hint}") from None
        if self.chat is not None or self.config.apply_chat_template:
            self._check_rendered(row[self.config.prompt_key], text, origin)
        return ids

    def _check_rendered(self, messages: list[dict[str, Any]], text: str, origin: RowOrigin) -> None:
        """Raise if the chat template left out an instruction message: Qwen2.5's and Qwen3's
        templates skip any role but system, user, assistant and tool (a 'developer' turn vanishes),
        and the model would train without the text. Assistant and tool turns are not checked:
        templates rewrite them by design (Qwen3 drops earlier reasoning, Llama-3.1 quotes tool
        output as JSON)."""
        for i, msg in enumerate(messages):
            content = msg["content"].strip()  # templates may trim (Llama-3, Gemma)
            if msg["role"] in ("system", "user", "developer") and content and content not in text:
                raise DatasetError(
                    f"{origin}: key '{self.config.prompt_key}[{i}]' (role {msg['role']!r}): the chat template does "
                    "not render its content, so the model would never see it; give it a role the template renders "
                    "(system or user), or use a template that renders it (actor_rollout_ref.model.tokenizer_path)")

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: int) -> dict[str, Any]:
        """One row: unpadded ``raw_prompt_ids`` (truncated per config) plus the row's other columns."""
        row = self.rows[i]
        ids = truncate_ids(self.prompt_ids[i], self.config.max_prompt_length, self.config.truncation, self.origins[i])
        item = {k: v for k, v in row.items() if k != self.config.prompt_key}
        item["raw_prompt_ids"] = ids
        if self.config.return_raw_chat:
            item["raw_prompt"] = list(row[self.config.prompt_key])
        extra = dict(item.get("extra_info") or {})
        item["extra_info"] = extra
        item["index"] = extra.get("index", i)
        # per tool: create/execute/calc_reward/release kwargs (parquet fills absent struct fields with None)
        item["tools_kwargs"] = {name: {k: v for k, v in (kw or {}).items() if v is not None}
                                for name, kw in (extra.get("tools_kwargs") or {}).items() if kw is not None}
        return item

    def collate(self, items: list[dict[str, Any]]) -> DataProto:
        return collate(items, self.tokenizer.pad_token_id)


def left_pad(sequences: Sequence[Sequence[int]], pad_id: int, length: int | None = None):
    """Left-pad token lists to ``length`` (default: the longest) -> input_ids, attention_mask, position_ids."""
    length = length or max(len(s) for s in sequences)
    input_ids = torch.full((len(sequences), length), pad_id, dtype=torch.long)
    attention_mask = torch.zeros((len(sequences), length), dtype=torch.long)
    for r, seq in enumerate(sequences):
        if seq:
            input_ids[r, length - len(seq):] = torch.as_tensor(seq, dtype=torch.long)
            attention_mask[r, length - len(seq):] = 1
    position_ids = (attention_mask.cumsum(dim=1) - 1).clamp(min=0)  # (B, P): 0.. over real tokens
    return input_ids, attention_mask, position_ids


def collate(items: list[dict[str, Any]], pad_id: int) -> DataProto:
    """Rows -> a DataProto with left-padded prompt tensors and every other column as an object array."""
    input_ids, attention_mask, position_ids = left_pad([it["raw_prompt_ids"] for it in items], pad_id)
    keys = list(dict.fromkeys(k for it in items for k in it))  # union, in first-seen order
    non_tensors = {k: [it.get(k) for it in items] for k in keys}
    return DataProto.from_dict(
        {"input_ids": input_ids, "attention_mask": attention_mask, "position_ids": position_ids},
        non_tensors,
    )
