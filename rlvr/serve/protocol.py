"""The request bodies ``rlvr serve`` reads, with SGLang's and vLLM's field names and defaults.

Every body is checked before anything reaches the engine, and every refusal is a 400 that names
the field (``BadRequest``): malformed JSON, a field rlvr does not know, and a field rlvr knows from
SGLang or OpenAI but does not implement (``frequency_penalty: 0.5``) are all refused, never
ignored. A field that is not implemented is accepted only at its neutral value, where it has no
effect (``frequency_penalty: 0`` is what rlvr does anyway; the openai client sends such values).

Shapes come from SGLang's ``GenerateReqInput``/``SamplingParams`` and vLLM's
``CompletionRequest``/``ChatCompletionRequest``; where they depart is in docs/serve.md.
"""

from __future__ import annotations

import json
import math
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, ValidationError


class BadRequest(ValueError):
    """A 400: ``param`` is the field at fault (as a dotted path), ``message`` says what to send."""

    def __init__(self, param: str, message: str, status: int = 400):
        super().__init__(f"{param}: {message}")
        self.param, self.message, self.status = param, message, status


MISSING = object()

# Fields SGLang or OpenAI/vLLM define that rlvr does not implement: {name: its neutral value}
# (None: only absence or null is neutral). At the neutral value a field changes nothing.
UNIMPLEMENTED_SAMPLING = {
    "frequency_penalty": 0.0, "presence_penalty": 0.0, "repetition_penalty": 1.0, "min_new_tokens": 0,
    "json_schema": None, "regex": None, "ebnf": None, "structural_tag": None, "logit_bias": None,
    "no_stop_trim": False, "spaces_between_special_tokens": True, "custom_params": None, "stream_interval": None,
}
UNIMPLEMENTED_GENERATE = {
    "token_ids_logprob": None, "image_data": None,
    "video_data": None, "audio_data": None, "input_embeds": None, "lora_path": None, "lora_id": None,
    "custom_logit_processor": None, "return_hidden_states": False, "session_params": None, "modalities": None,
    "bootstrap_host": None, "bootstrap_port": None, "bootstrap_room": None, "data_parallel_rank": None,
    "log_metrics": True,
}
UNIMPLEMENTED_OPENAI = {
    "frequency_penalty": 0.0, "presence_penalty": 0.0, "repetition_penalty": 1.0, "logit_bias": None,
    "best_of": None, "echo": False, "suffix": None, "min_tokens": 0, "include_stop_str_in_output": False,
    "response_format": None, "guided_json": None, "guided_regex": None, "guided_choice": None,
    "guided_grammar": None, "structured_outputs": None, "use_beam_search": False, "length_penalty": 1.0,
    "allowed_token_ids": None, "prompt_logprobs": None, "truncate_prompt_tokens": None, "priority": 0,
    "spaces_between_special_tokens": True, "return_tokens_as_token_ids": None, "bad_words": None,
    "parallel_tool_calls": True, "prompt_embeds": None, "cache_salt": None, "kv_transfer_params": None,
    "vllm_xargs": None, "documents": None, "chat_template": None, "continue_final_message": False,
    "mm_processor_kwargs": None, "reasoning_effort": None, "metadata": None, "store": False, "service_tier": None,
    "modalities": None, "audio": None, "prediction": None, "web_search_options": None, "function_call": None,
    "functions": None, "add_special_tokens": MISSING,
}


def parse_json(body: bytes) -> dict[str, Any]:
    """The request's JSON object, or a 400 that says where the JSON broke."""
    try:
        data = json.loads(body or b"")
    except ValueError as err:  # JSONDecodeError and UnicodeDecodeError
        raise BadRequest("body", f"malformed JSON ({err}); send a JSON object") from None
    if not isinstance(data, dict):
        raise BadRequest("body", f"must be a JSON object, got {type(data).__name__}")
    return data


def refuse_unimplemented(data: dict[str, Any], table: dict[str, Any], where: str = "") -> dict[str, Any]:
    """``data`` without the fields of ``table`` that hold their neutral value; any other value of
    such a field is a 400 naming it."""
    kept = {}
    for key, value in data.items():
        if key not in table:
            kept[key] = value
            continue
        neutral = table[key]
        if value is None or (neutral is not MISSING and value == neutral):
            continue
        said = "" if neutral is MISSING or neutral is None else f" (or {json.dumps(neutral)}, which has no effect)"
        raise BadRequest(where + key, f"is not implemented by rlvr serve; leave it out{said}")
    return kept


def validate(model: type[BaseModel], data: dict[str, Any], where: str = "") -> Any:
    """``model.model_validate(data)``, its first error as a 400 naming the field; a value that fits
    none of a union field's forms names the field (not pydantic's tag of the first form tried,
    ``prompt.str``) and lists its forms."""
    try:
        return model.model_validate(data)
    except ValidationError as err:
        errors = err.errors()
        first = errors[0]
        path, union, value = field_path(data, first["loc"], first["type"] == "missing")
        if union is not None:
            forms = [str(e["loc"][len(union)]) for e in errors
                     if field_path(data, e["loc"], e["type"] == "missing")[1] == union]
            raise BadRequest(where + ".".join(union) if union else where.rstrip(".") or "body",
                             f"is none of its forms: {', '.join(dict.fromkeys(forms))} "
                             f"(got {json.dumps(value, default=str)[:80]})") from None
        param = where + ".".join(path) if path else where.rstrip(".") or "body"
        if first["type"] == "extra_forbidden":
            raise BadRequest(param, "is not a field rlvr serve knows (see docs/serve.md for the fields it reads)") \
                from None
        raise BadRequest(param, f"{first['msg']} (got {json.dumps(first.get('input'), default=str)[:80]})") from None


def field_path(data: Any, loc: tuple, missing: bool) -> tuple[list[str], list[str] | None, Any]:
    """An error location's keys and indices in the request, the path of the union field whose
    form's tag (pydantic's ``str``, ``list[int]``: no key of the request) comes first in it, and
    that field's value. ``loc[len(union)]`` is the tag."""
    path, union, at, value = [], None, data, None
    for i, part in enumerate(loc):
        if isinstance(part, int) and isinstance(at, list) and 0 <= part < len(at):
            at = at[part]
        elif isinstance(part, str) and isinstance(at, dict) and (part in at or (missing and i == len(loc) - 1)):
            at = at.get(part)
        else:
            if union is None:
                union, value = list(path), at
            continue
        path.append(str(part))
    return path, union, value


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=False)


class SGLangSamplingParams(Strict):
    """SGLang's ``sampling_params``: defaults as SGLang's (128 new tokens, temperature 1)."""

    max_new_tokens: int = 128
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    min_p: float = 0.0
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    n: int = 1
    sampling_seed: int | None = None


class GenerateRequest(Strict):
    """SGLang's ``GenerateReqInput`` for one prompt."""

    text: str | None = None
    input_ids: list[int] | None = None
    sampling_params: dict[str, Any] | None = None
    return_logprob: bool = False
    logprob_start_len: int = -1
    top_logprobs_num: int = 0
    return_text_in_logprobs: bool = False
    rid: str | None = None
    stream: bool = False


class StreamOptions(Strict):
    include_usage: bool = False
    continuous_usage_stats: bool = False


class OpenAISampling(Strict):
    """The sampling fields vLLM's completion and chat requests share (vLLM's extras included)."""

    model: str | None = None
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    n: int = 1
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    seed: int | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    return_token_ids: bool | None = None
    skip_special_tokens: bool = True
    user: str | None = None
    request_id: str | None = None


class CompletionRequest(OpenAISampling):
    prompt: str | list[int] | list[str] | list[list[int]]
    max_tokens: int | None = 16  # OpenAI's and vLLM's default for completions
    logprobs: int | None = None


class ChatCompletionRequest(OpenAISampling):
    messages: list[dict[str, Any]]
    max_completion_tokens: int | None = None
    logprobs: bool = False
    top_logprobs: int | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: Literal["none", "auto"] | dict[str, Any] | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    add_generation_prompt: bool = True


class AbortRequest(Strict):
    rid: str = ""
    abort_all: bool = False


class PauseRequest(Strict):
    mode: str = "abort"


class UpdateWeightsFromDisk(Strict):
    model_path: str
    load_format: str | None = None
    abort_all_requests: bool = False
    weight_version: str | None = None
    flush_cache: bool = True
    keep_pause: bool = False
    is_async: Literal[False] = False
    torch_empty_cache: bool = False
    recapture_cuda_graph: Literal[False] = False
    token_step: int = 0


class InitWeightsUpdateGroup(Strict):
    master_address: str
    master_port: int
    rank_offset: int
    world_size: int
    group_name: str = "weight_update_group"
    backend: str = "gloo"  # SGLang's default is nccl; rlvr's server has gloo only


class UpdateWeightsFromDistributed(Strict):
    names: list[str]
    dtypes: list[str]
    shapes: list[list[int]]
    group_name: str = "weight_update_group"
    flush_cache: bool = True
    abort_all_requests: bool = False
    weight_version: str | None = None
    load_format: None = None


class DestroyWeightsUpdateGroup(Strict):
    group_name: str = "weight_update_group"


class MemoryTags(Strict):
    tags: list[str] | None = None


def check_stop_and_seed(stop: tuple[str, ...], seed: int | None, stop_field: str, seed_field: str) -> None:
    """An empty stop string (which every text contains: each request stopped at its first token, with
    empty text) and a seed torch's generators cannot take (outside [-2^63, 2^64)) are refused, as vLLM
    refuses the first."""
    if any(s == "" for s in stop):
        raise BadRequest(stop_field, "a stop string must not be empty (every text contains it)")
    if seed is not None and not (-2 ** 63 <= seed < 2 ** 64):
        raise BadRequest(seed_field, f"must be an integer in [-2^63, 2^64), got {seed}")


def check_sampling(temperature: float, top_p: float, top_k: int, min_p: float, n: int, max_n: int,
                   names: dict[str, str]) -> None:
    """The ranges SGLang and vLLM accept; ``names`` maps each to the field name of the route."""
    if not math.isfinite(temperature) or temperature < 0:
        raise BadRequest(names["temperature"], f"must be a finite number >= 0 (0 is greedy), got {temperature}")
    if not (0 < top_p <= 1):
        raise BadRequest(names["top_p"], f"must be in (0, 1], got {top_p}")
    if top_k == 0 or top_k < -1:
        raise BadRequest(names["top_k"], f"must be -1 (off) or at least 1, got {top_k}")
    if not (0 <= min_p <= 1):
        raise BadRequest(names["min_p"], f"must be in [0, 1], got {min_p}")
    if not (1 <= n <= max_n):
        raise BadRequest(names["n"], f"must be between 1 and {max_n}, got {n}")
