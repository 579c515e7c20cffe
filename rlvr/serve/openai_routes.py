"""OpenAI's routes as vLLM serves them: ``/v1/models``, ``/v1/completions``, ``/v1/chat/completions``.

Response shapes follow vLLM's ``protocol.py``: each completion choice carries ``prompt_token_ids``
and ``token_ids``, each chat response ``prompt_token_ids`` and each of its choices ``token_ids``,
always (vLLM adds them when ``return_token_ids`` is true; rlvr's clients always need them), and
``stop_reason`` says which stop string or token ended a choice. Tool calls are read from the text
by rlvr's parsers (``rlvr/tools/parsers.py``, ``--tool-call-parser``). Log-probs are the sampled
token's only: ``logprobs`` above 0 (completions) or ``top_logprobs`` above 0 (chat) are refused.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
import uuid
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import StreamingResponse

from rlvr.rollout.async_engine import EngineBusy
from rlvr.rollout.base import Completion
from rlvr.serve.app import finish_text, read_body, sse
from rlvr.serve.protocol import (UNIMPLEMENTED_OPENAI, BadRequest, ChatCompletionRequest, CompletionRequest,
                                 OpenAISampling, check_sampling, check_stop_and_seed, refuse_unimplemented, validate)
from rlvr.serve.state import MAX_N, RowSpec, Server, wait_for_disconnect


def add_openai_routes(app: FastAPI, server: Server) -> None:
    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": server.model_name, "object": "model", "created": int(time.time()),
                                            "owned_by": "rlvr", "root": server.model_path, "parent": None,
                                            "max_model_len": server.max_model_len}]}

    @app.post("/v1/completions")
    async def completions(request: Request):
        body = validate(CompletionRequest, refuse_unimplemented(await read_body(request), UNIMPLEMENTED_OPENAI))
        check_model(server, body)
        check_stream_options(body)
        if body.logprobs is not None and body.logprobs != 0:
            raise BadRequest("logprobs", "rlvr returns the sampled token's log-prob only: use logprobs=0")
        prompts = completion_prompts(server, body.prompt)
        specs = [openai_spec(server, body, p, body.max_tokens, "max_tokens") for p in prompts]
        kind = Kind("cmpl", "text_completion", chat=False, logprobs=body.logprobs is not None)
        if body.stream:
            return stream(server, request, body, specs, kind)
        return await respond(server, request, body, specs, kind)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        body = validate(ChatCompletionRequest, refuse_unimplemented(await read_body(request), UNIMPLEMENTED_OPENAI))
        check_model(server, body)
        check_stream_options(body)
        if body.top_logprobs:
            raise BadRequest("top_logprobs", "rlvr returns the sampled token's log-prob only: use top_logprobs=0")
        if isinstance(body.tool_choice, dict):
            raise BadRequest("tool_choice", "naming a function is not implemented: use 'auto' or 'none'")
        if body.max_tokens is not None and body.max_completion_tokens is not None:
            raise BadRequest("max_completion_tokens", "give one of max_tokens and max_completion_tokens")
        tools = chat_tools(body)
        if body.stream and tools:
            raise BadRequest("stream", "streaming tool calls is not implemented: use stream=false with tools")
        prompt = chat_prompt(server, body)
        limit = body.max_completion_tokens if body.max_completion_tokens is not None else body.max_tokens
        field_name = "max_completion_tokens" if body.max_completion_tokens is not None else "max_tokens"
        specs = [openai_spec(server, body, prompt, limit, field_name)]
        kind = Kind("chatcmpl", "chat.completion", chat=True, logprobs=body.logprobs, tools=tools)
        if body.stream:
            return stream(server, request, body, specs, kind)
        return await respond(server, request, body, specs, kind)


class Kind:
    """Which of the two routes answers, and what its choices carry."""

    def __init__(self, prefix: str, obj: str, chat: bool, logprobs: bool, tools=None):
        self.prefix, self.object, self.chat, self.logprobs, self.tools = prefix, obj, chat, logprobs, tools


def check_model(server: Server, body: OpenAISampling) -> None:
    if body.model is not None and body.model not in (server.model_name, server.model_path):
        raise BadRequest("model", f"the model {body.model!r} does not exist here; this server serves "
                                  f"{server.model_name!r}", status=404)


def check_stream_options(body: OpenAISampling) -> None:
    """vLLM's: ``stream_options`` only with ``stream`` (its ``include_usage`` would change nothing)."""
    if body.stream_options is not None and body.stream_options.model_fields_set and not body.stream:
        raise BadRequest("stream_options", "is only read with stream=true; leave it out or set stream")


def completion_prompts(server: Server, prompt) -> list[list[int]]:
    """A prompt, or a list of them, as text or token ids -> token ids each."""
    if isinstance(prompt, str):
        return [server.check_prompt(server.encode(prompt), "prompt")]
    if prompt and isinstance(prompt[0], int):
        return [server.check_prompt(prompt, "prompt")]
    if not prompt:
        raise BadRequest("prompt", "is empty")
    return [server.check_prompt(server.encode(p) if isinstance(p, str) else p, f"prompt.{i}")
            for i, p in enumerate(prompt)]


def chat_tools(body: ChatCompletionRequest):
    from rlvr.tools.schema import OpenAIFunctionToolSchema, SchemaError

    if not body.tools:
        return None
    try:
        tools = [OpenAIFunctionToolSchema.from_dict(t, where=f"tools.{i}") for i, t in enumerate(body.tools)]
    except SchemaError as err:
        raise BadRequest(str(err).split(":", 1)[0], str(err).split(":", 1)[-1].strip()) from None
    return tools if body.tool_choice != "none" else None


def chat_prompt(server: Server, body: ChatCompletionRequest) -> list[int]:
    """The messages through the tokenizer's chat template (with the tools, when given)."""
    for i, message in enumerate(body.messages):
        if message.get("role") not in ("system", "user", "assistant", "tool", "developer"):
            raise BadRequest(f"messages.{i}.role", f"{message.get('role')!r}: use system, user, assistant or tool")
    for key in ("chat_template", "tokenize", "tools", "add_generation_prompt", "conversation"):
        if key in (body.chat_template_kwargs or {}):  # a client's own template runs on the server: refused, as vLLM
            raise BadRequest(f"chat_template_kwargs.{key}", "is not a template variable; a template of the "
                                                            "client's own is not run here")
    body.messages = template_messages(body.messages)  # the gateway's render_chat reads them too
    try:
        text = server.tokenizer.apply_chat_template(body.messages, tools=body.tools if body.tool_choice != "none"
                                                    else None, add_generation_prompt=body.add_generation_prompt,
                                                    tokenize=False, **(body.chat_template_kwargs or {}))
    except Exception as err:  # jinja's errors are many kinds; each becomes the client's 400
        raise BadRequest("messages", f"the chat template refused them: {err}") from None
    ids = server.tokenizer.encode(text, add_special_tokens=False)
    if server.render_chat is not None:
        ids = server.render_chat(body, ids)
    return server.check_prompt(ids, "messages")


def template_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The messages as vLLM hands them to a chat template: text content parts joined by newlines
    (vLLM's "string" content format; a template that adds strings raised on the list), and each
    assistant tool call's ``arguments`` (OpenAI's JSON text) as a mapping, which templates write with
    ``| tojson`` (Qwen2.5's: the text came out quoted and escaped); an empty ``tool_calls`` is dropped.
    Copies: the client's messages are left as sent."""
    out = []
    for i, message in enumerate(messages):
        message = dict(message)
        if isinstance(message.get("content"), list):
            message["content"] = "\n".join(part_text(part, f"messages.{i}.content.{j}")
                                           for j, part in enumerate(message["content"]))
        calls = message.get("tool_calls")
        if message.get("role") == "assistant" and isinstance(calls, list):
            message["tool_calls"] = [template_call(call, f"messages.{i}.tool_calls.{j}")
                                     for j, call in enumerate(calls)]
            if not calls:
                del message["tool_calls"]
        out.append(message)
    return out


def part_text(part: Any, where: str) -> str:
    kind = part.get("type") if isinstance(part, dict) else None
    if kind != "text":
        raise BadRequest(f"{where}.type", f"{kind!r}: rlvr serve takes text parts only ({{\"type\": \"text\", "
                                          "\"text\": ...}}) or a string")
    if not isinstance(part.get("text"), str):
        raise BadRequest(f"{where}.text", "a text part needs its text as a string")
    return part["text"]


def template_call(call: Any, where: str) -> dict[str, Any]:
    function = call.get("function") if isinstance(call, dict) else None
    if not isinstance(function, dict) or call.get("type", "function") != "function":
        raise BadRequest(where, "a tool call is {\"type\": \"function\", \"function\": {\"name\", \"arguments\"}}")
    arguments = function.get("arguments")
    if isinstance(arguments, str) and arguments.strip():
        try:
            arguments = json.loads(arguments)
        except ValueError as err:
            raise BadRequest(f"{where}.function.arguments", f"not valid JSON ({err}); send the call's arguments "
                                                            "as a JSON object's text") from None
    elif arguments in (None, ""):
        arguments = {}
    if not isinstance(arguments, dict):
        raise BadRequest(f"{where}.function.arguments", f"must be a JSON object (its text), got "
                                                        f"{json.dumps(arguments)[:80]}")
    return {**call, "function": {**function, "arguments": arguments}}


def openai_spec(server: Server, body: OpenAISampling, prompt: list[int], max_tokens: int | None,
                field_name: str) -> RowSpec:
    temperature = 1.0 if body.temperature is None else body.temperature
    top_p = 1.0 if body.top_p is None else body.top_p
    top_k = -1 if body.top_k is None else body.top_k
    min_p = 0.0 if body.min_p is None else body.min_p
    check_sampling(temperature, top_p, top_k, min_p, body.n, MAX_N,
                   {k: k for k in ("temperature", "top_p", "top_k", "min_p", "n")})
    stop = (body.stop,) if isinstance(body.stop, str) else tuple(body.stop or ())
    check_stop_and_seed(stop, body.seed, "stop", "seed")
    return RowSpec(prompt, server.budget(len(prompt), max_tokens, field_name), temperature, top_p, top_k, min_p,
                   stop, server.check_token_ids(body.stop_token_ids, "stop_token_ids"), body.ignore_eos, body.n,
                   body.seed)


def finish_reason(completion: Completion, tool_calls: list | None) -> str:
    if tool_calls:
        return "tool_calls"
    return completion.finish_reason


def stop_reason(completion: Completion, server: Server) -> int | str | None:
    """vLLM's: the stop string or stop token that ended the choice; None at EOS or the length."""
    matched = completion.matched  # None where the engine does not say (the training gateway's rounds)
    if completion.finish_reason != "stop" or matched is None or matched in server.engine.core.eos_ids:
        return None
    return matched


def parse_tool_calls(server: Server, text: str, tools) -> tuple[str | None, list[dict[str, Any]]]:
    """(content before the first call, the calls) for the chat response; a call that does not parse
    leaves the text as content."""
    from rlvr.tools.parsers import get_tool_parser

    parser = get_tool_parser(server.tool_parser, tools)
    calls = [c for c in parser.parse(text) if c.error is None and c.name is not None]
    if not calls:
        return text, []
    opening = "<tool_call>" if server.tool_parser == "hermes" else "|".join(f"<{re.escape(t.name)}>" for t in tools)
    found = re.search(opening, text)
    content = text[:found.start()].strip() if found else ""
    return content or None, [{"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
                              "function": {"name": c.name, "arguments": c.arguments}} for c in calls]


def token_logprobs(server: Server, completion: Completion, kind: Kind, offset: int = 0) -> dict[str, Any] | None:
    """The choice's (or a chunk's) ``logprobs``: vLLM's chat ``content`` entries, or its
    ``CompletionLogProbs`` for ``logprobs`` = 0, each token's ``top_logprobs`` the sampled token's
    alone, and ``text_offset`` counted from ``offset`` (a stream's chunk: the tokens' text before it)."""
    if not kind.logprobs:
        return None
    texts = [server.decode([t], False) for t in completion.token_ids]
    if kind.chat:
        return {"content": [{"token": s, "logprob": lp, "bytes": list(s.encode()), "top_logprobs": []}
                            for s, lp in zip(texts, completion.log_probs)]}
    offsets, at = [], offset
    for s in texts:
        offsets.append(at)
        at += len(s)
    return {"text_offset": offsets, "token_logprobs": list(completion.log_probs), "tokens": texts,
            "top_logprobs": [{s: lp} for s, lp in zip(texts, completion.log_probs)]}


def choice(server: Server, index: int, completion: Completion, spec: RowSpec, kind: Kind, skip: bool) -> dict:
    text = finish_text(server, completion, skip)
    out: dict[str, Any] = {"index": index, "logprobs": token_logprobs(server, completion, kind)}
    calls: list = []
    if kind.chat:
        # calls are read from the whole text: a stop string may be a call's closing tag
        whole = server.decode(completion.token_ids, skip)
        content, calls = parse_tool_calls(server, whole, kind.tools) if kind.tools else (text, [])
        out["message"] = {"role": "assistant", "content": content if calls else text, "tool_calls": calls}
    else:
        out["text"] = text
        out["prompt_token_ids"] = spec.prompt_ids
    out.update(finish_reason=finish_reason(completion, calls), stop_reason=stop_reason(completion, server),
               token_ids=completion.token_ids)
    return out


async def respond(server: Server, request: Request, body: OpenAISampling, specs: list[RowSpec], kind: Kind) -> dict:
    """Every prompt's ``n`` choices (choice ``i * n + j``), gathered."""
    base = body.request_id or uuid.uuid4().hex
    rows_of = [server.requests(spec, base if len(specs) == 1 else f"{base}-{i}") for i, spec in enumerate(specs)]
    prompts = [asyncio.ensure_future(server.complete(request, rid, rows)) for rid, rows in rows_of]
    try:
        results = await asyncio.gather(*prompts)
    except BaseException:  # one prompt failed (503, 504, an id in use): the others' rows are aborted too
        for future in prompts:
            future.cancel()
        raise
    choices, prompt_tokens, completion_tokens, versions = [], 0, 0, set()
    for spec, completions in zip(specs, results):
        prompt_tokens += len(spec.prompt_ids)
        for completion in completions:
            choices.append(choice(server, len(choices), completion, spec, kind, body.skip_special_tokens))
            completion_tokens += len(completion.token_ids)
            versions.add(server.version_name(completion))
    out = {"id": f"{kind.prefix}-{base}", "object": kind.object, "created": int(time.time()),
           "model": server.model_name, "choices": choices,
           "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                     "total_tokens": prompt_tokens + completion_tokens},
           "weight_version": versions.pop() if len(versions) == 1 else sorted(versions)}
    if kind.chat:
        out["prompt_token_ids"] = specs[0].prompt_ids
    return out


def streamable(text: str, stops: list[str], hold: int) -> str:
    """What of ``text`` may go out now: up to the first stop string in it (the token that completes
    one reaches the stream before the engine ends the row, and the stop string is never sent), else
    all but the last ``hold`` characters (the start of a stop string still to come) and an
    unfinished character."""
    cuts = [text.find(stop) for stop in stops if stop in text]
    safe = text[:min(cuts)] if cuts else text[:len(text) - hold] if hold else text
    return safe.rstrip("\ufffd")


def stream(server: Server, request: Request, body: OpenAISampling, specs: list[RowSpec], kind: Kind):
    """Server-sent events: one chunk per new token per choice (text held back while it may still
    become a stop string or an unfinished character), a last chunk with its finish reason and the
    weight version it ran under, then usage if ``stream_options.include_usage``, then ``[DONE]``."""
    base = body.request_id or uuid.uuid4().hex
    rows_of = [server.requests(spec, base if len(specs) == 1 else f"{base}-{i}") for i, spec in enumerate(specs)]
    if body.stream_options is not None and body.stream_options.continuous_usage_stats:
        raise BadRequest("stream_options.continuous_usage_stats", "is not implemented; usage comes in the last "
                                                                  "chunk with include_usage")
    server.check_room(sum(len(rows) for _, rows in rows_of))
    chunk_object = "chat.completion.chunk" if kind.chat else "text_completion"
    created, n = int(time.time()), specs[0].n
    hold = max((len(s) for s in specs[0].stop), default=1) - 1

    def chunk(index: int, delta: dict[str, Any], finish: str | None = None, top: dict | None = None, **extra) -> str:
        if kind.chat:
            one = {"index": index, "delta": delta, "logprobs": extra.pop("logprobs", None), "finish_reason": finish}
        else:
            one = {"index": index, "text": delta.get("content", ""), "logprobs": extra.pop("logprobs", None),
                   "finish_reason": finish}
        one.update(extra)
        return sse({"id": f"{kind.prefix}-{base}", "object": chunk_object, "created": created,
                    "model": server.model_name, "choices": [one], **(top or {})})

    async def events():
        queue: asyncio.Queue = asyncio.Queue()
        tasks = []
        try:
            for i, (rid, rows) in enumerate(rows_of):
                tasks += server.tasks(rid, rows, lambda j, ids, lps, i=i: queue.put_nowait((i * n + j, ids, lps)))
        except BadRequest as err:  # the id of a request that started since the route checked it
            for task in tasks:
                task.cancel()
            yield sse({"error": {"message": err.message, "type": "BadRequestError", "param": err.param, "code": 400}})
            return
        for t, task in enumerate(tasks):
            task.add_done_callback(lambda task, t=t: queue.put_nowait((t, None, None)))
        watcher = asyncio.create_task(wait_for_disconnect(request))
        watcher.add_done_callback(lambda _: queue.put_nowait((-1, None, None)))
        tokens = [[] for _ in tasks]
        sent = ["" for _ in tasks]
        offsets = [0 for _ in tasks]  # each choice's text_offset so far (its tokens' texts, as unstreamed)
        open_rows = len(tasks)
        try:
            if kind.chat:  # vLLM's chat stream opens with the role, before any token
                for index in range(len(tasks)):
                    sse_first = {"id": f"{kind.prefix}-{base}", "object": chunk_object, "created": created,
                                 "model": server.model_name, "prompt_token_ids": specs[index // n].prompt_ids,
                                 "choices": [{"index": index, "delta": {"role": "assistant", "content": ""},
                                              "logprobs": None, "finish_reason": None}]}
                    yield sse(sse_first)
            opened = [kind.chat] * len(tasks)  # a completion's first chunk is its first token's (vLLM's), with the prompt ids
            loop = asyncio.get_running_loop()
            deadline = loop.time() + server.request_timeout
            while open_rows:
                index, ids, lps = await asyncio.wait_for(queue.get(), max(deadline - loop.time(), 0.001))
                if index < 0:
                    return  # the client left: finally aborts the rows
                if ids is not None:
                    lp = token_logprobs(server, Completion(ids, lps, "stop"), kind, offset=offsets[index])
                    if lp is not None and not kind.chat:
                        offsets[index] += sum(len(t) for t in lp["tokens"])
                    tokens[index] += ids
                    safe = streamable(server.decode(tokens[index], body.skip_special_tokens), specs[0].stop, hold)
                    delta, sent[index] = safe[len(sent[index]):], max(sent[index], safe, key=len)
                    extra = {} if opened[index] else {"prompt_token_ids": specs[index // n].prompt_ids}
                    opened[index] = True
                    yield chunk(index, {"content": delta}, logprobs=lp, token_ids=ids, **extra)
                    continue
                open_rows -= 1
                completion = tasks[index].result()
                text = finish_text(server, completion, body.skip_special_tokens)
                yield chunk(index, {"content": text[len(sent[index]):]}, finish_reason(completion, None),
                            top={"weight_version": server.version_name(completion)},  # as the whole response's
                            stop_reason=stop_reason(completion, server), token_ids=[])
            if body.stream_options is not None and body.stream_options.include_usage:
                prompt_tokens = sum(len(s.prompt_ids) for s in specs)  # each prompt once, whatever n (vLLM's count)
                completion_tokens = sum(len(t) for t in tokens)
                yield sse({"id": f"{kind.prefix}-{base}", "object": chunk_object, "created": created,
                           "model": server.model_name, "choices": [],
                           "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                                     "total_tokens": prompt_tokens + completion_tokens}})
            yield "data: [DONE]\n\n"
        except asyncio.TimeoutError:
            yield sse({"error": {"message": f"ran past --request-timeout {server.request_timeout:g} s; aborted",
                                 "type": "TimeoutError", "param": "request", "code": 504}})
        except EngineBusy as err:  # the queue filled between the check and a row's add
            yield sse({"error": {"message": f"the queue is full ({err}); retry later",
                                 "type": "ServiceUnavailableError", "param": "server", "code": 503}})
        finally:  # also when the client is gone and the server closes this generator
            watcher.cancel()
            server.aborted += sum(not task.done() for task in tasks)
            for task in tasks:
                task.cancel()

    return StreamingResponse(events(), media_type="text/event-stream")
