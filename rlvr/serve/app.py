"""The FastAPI app of ``rlvr serve``: SGLang's native routes here, OpenAI's in ``openai_routes.py``.

``build_app(server)`` wires the routes to a ``Server`` (``state.py``). Errors are JSON
``{"error": {"message", "type", "param", "code"}}`` (vLLM's ``ErrorResponse``), 400 for bad input
with ``param`` naming the field, 401 without the API key, 503 with ``Retry-After`` when the queue
is full, 504 past ``--request-timeout``.

Where rlvr departs from SGLang (docs/serve.md): one prompt per request (no batch of texts), a
streamed request makes one sample, weight versions named by the client (SGLang's strings) over the
engine's counter, and the distributed weight update joins gloo groups only.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import secrets
import threading
import time
from typing import Any

import torch
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse

from rlvr.rollout.async_engine import EngineBusy, settle
from rlvr.rollout.base import Completion
from rlvr.serve.protocol import (UNIMPLEMENTED_GENERATE, UNIMPLEMENTED_SAMPLING, AbortRequest, BadRequest,
                                 DestroyWeightsUpdateGroup, GenerateRequest, InitWeightsUpdateGroup, MemoryTags,
                                 PauseRequest, SGLangSamplingParams, UpdateWeightsFromDisk,
                                 UpdateWeightsFromDistributed, check_sampling, check_stop_and_seed, parse_json,
                                 refuse_unimplemented,
                                 validate)
from rlvr.serve.state import MAX_N, ClientGone, RowSpec, Server, wait_for_disconnect

RETRY_AFTER_S = 1


def error_response(status: int, message: str, param: str | None = None) -> JSONResponse:
    kind = {400: "BadRequestError", 401: "AuthenticationError", 404: "NotFoundError", 501: "NotImplementedError",
            503: "ServiceUnavailableError", 504: "TimeoutError"}.get(status, "Error")
    headers = {"Retry-After": str(RETRY_AFTER_S)} if status == 503 else None
    return JSONResponse({"error": {"message": message, "type": kind, "param": param, "code": status}},
                        status_code=status, headers=headers)


def bad_request_response(err: BadRequest) -> JSONResponse:
    return error_response(err.status, f"{err.param}: {err.message}", err.param)


async def read_body(request: Request) -> dict[str, Any]:
    return parse_json(await request.body())


def build_app(server: Server) -> FastAPI:
    app = FastAPI(title="rlvr serve", docs_url=None, redoc_url=None, openapi_url=None)
    app.state.server = server

    @app.middleware("http")
    async def require_key(request: Request, call_next):
        if server.api_key is not None:
            given = request.headers.get("authorization", "")
            if not secrets.compare_digest(given.encode(), f"Bearer {server.api_key}".encode()):
                return error_response(401, "missing or wrong API key: send the header Authorization: Bearer KEY")
        return await call_next(request)

    @app.exception_handler(BadRequest)
    async def on_bad_request(request: Request, err: BadRequest):
        return bad_request_response(err)

    @app.exception_handler(ClientGone)
    async def on_client_gone(request: Request, err: ClientGone):
        return Response(status_code=499)  # nobody reads it: the client has gone (nginx's code)

    add_sglang_routes(app, server)
    from rlvr.serve.openai_routes import add_openai_routes

    add_openai_routes(app, server)
    return app


# ---------------------------------------------------------------------- /generate
def sglang_spec(server: Server, body: GenerateRequest) -> tuple[RowSpec, bool]:
    """The rows of a /generate body -> (spec, skip_special_tokens)."""
    raw = refuse_unimplemented(body.sampling_params or {}, UNIMPLEMENTED_SAMPLING, "sampling_params.")
    sp = validate(SGLangSamplingParams, raw, "sampling_params.")
    if (body.text is None) == (body.input_ids is None):
        raise BadRequest("text" if body.text is None else "input_ids", "give exactly one of text and input_ids")
    if body.text is not None:
        prompt = server.check_prompt(server.encode(body.text), "text")
    else:
        prompt = server.check_prompt(body.input_ids, "input_ids")
    names = {k: f"sampling_params.{k}" for k in ("temperature", "top_p", "top_k", "min_p", "n")}
    check_sampling(sp.temperature, sp.top_p, sp.top_k, sp.min_p, sp.n, MAX_N, names)
    stop = (sp.stop,) if isinstance(sp.stop, str) else tuple(sp.stop or ())
    check_stop_and_seed(stop, sp.sampling_seed, "sampling_params.stop", "sampling_params.sampling_seed")
    spec = RowSpec(prompt, server.budget(len(prompt), sp.max_new_tokens, "sampling_params.max_new_tokens"),
                   sp.temperature, sp.top_p, sp.top_k, sp.min_p, stop,
                   server.check_token_ids(sp.stop_token_ids, "sampling_params.stop_token_ids"), sp.ignore_eos, sp.n,
                   sp.sampling_seed)
    return spec, sp.skip_special_tokens


def finish_text(server: Server, completion: Completion, skip_special_tokens: bool) -> str:
    """The completion's text, cut before a stop string that ended it (SGLang's and vLLM's default)."""
    text = server.decode(completion.token_ids, skip_special_tokens)
    if isinstance(completion.matched, str) and completion.matched in text:
        text = text[:text.index(completion.matched)]
    return text


def sglang_finish_reason(completion: Completion, budget: int) -> dict[str, Any]:
    if completion.finish_reason == "stop":
        return {"type": "stop", "matched": completion.matched}
    if completion.finish_reason == "length":
        return {"type": "length", "length": budget}
    return {"type": "abort", "message": "aborted"}


def check_logprob_fields(body: GenerateRequest, prompt_len: int) -> None:
    """SGLang's prompt log-prob fields: ``logprob_start_len`` -1 (none) or 0..L, ``top_logprobs_num``
    >= 0, both only with ``return_logprob`` (SGLang ignores them without it; rlvr refuses)."""
    asked = body.logprob_start_len != -1 or body.top_logprobs_num != 0
    if asked and not body.return_logprob:
        raise BadRequest("return_logprob", "logprob_start_len and top_logprobs_num need return_logprob=true")
    if not -1 <= body.logprob_start_len <= prompt_len:
        raise BadRequest("logprob_start_len", f"{body.logprob_start_len} is outside -1..{prompt_len} (the prompt's "
                                              "length): the first prompt position whose log-prob to return")
    if body.top_logprobs_num < 0:
        raise BadRequest("top_logprobs_num", f"{body.top_logprobs_num} must be >= 0")
    if asked and body.stream:
        raise BadRequest("stream", "prompt log-probs and top log-probs come with the whole output: stream=false")


def scored_sequence(model, ids: list[int], start: int, topk: int) -> tuple[list[float], list, list]:
    """One forward over ``ids`` (prompt and output): for each position p > ``start`` the log-prob of
    ``ids[p]`` given ``ids[:p]`` and the ``topk`` largest log-probs (with their ids) of that
    distribution, in the served model's precision, at temperature 1 (SGLang's prompt log-probs)."""
    rows = len(ids) - start  # the distributions at positions start .. len - 1 (the last predicts nothing)
    with torch.inference_mode():
        x = torch.tensor([ids], device=model.device)
        logp = torch.log_softmax(model(input_ids=x, use_cache=False, logits_to_keep=rows).logits[0].float(), -1)
        logp = logp[:-1]  # (rows - 1, V): row r predicts ids[start + 1 + r]
        target = torch.tensor(ids[start + 1:], device=logp.device)
        token = logp.gather(-1, target.unsqueeze(-1)).squeeze(-1).tolist()
        if not topk:
            return token, [], []
        values, indices = logp.topk(min(topk, logp.shape[-1]), dim=-1)
        return token, values.tolist(), indices.tolist()


async def sequence_scores(server: Server, body: GenerateRequest, spec: RowSpec, completion: Completion):
    """The prompt (from ``logprob_start_len``) and output log-probs SGLang returns beside an output."""
    ids = list(spec.prompt_ids) + list(completion.token_ids)
    start = scored_from(body, len(spec.prompt_ids))
    return await server.engine.call(lambda: scored_sequence(server.model, ids, start, body.top_logprobs_num))


def scored_from(body: GenerateRequest, prompt_len: int) -> int:
    """The first position whose distribution ``scored_sequence`` keeps: ``logprob_start_len``, and
    at most the prompt's last (whose distribution is the first output token's)."""
    return min(body.logprob_start_len, prompt_len - 1) if body.logprob_start_len >= 0 else prompt_len - 1


def sglang_output(server: Server, completion: Completion, spec: RowSpec, body: GenerateRequest,
                  skip_special_tokens: bool, started: float, scores=None) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "id": completion.request_id, "finish_reason": sglang_finish_reason(completion, spec.max_new_tokens),
        "prompt_tokens": len(spec.prompt_ids), "completion_tokens": len(completion.token_ids),
        "weight_version": server.version_name(completion), "e2e_latency": time.perf_counter() - started}
    if completion.version_starts:  # an update crossed it in place: where each version's tokens start (rlvr's)
        meta["weight_version_starts"] = [[first, server.versions.get(v, str(v))]
                                         for first, v in completion.version_starts]
    if body.return_logprob:
        def text(tok: int):
            return server.decode([tok], False) if body.return_text_in_logprobs else None

        meta["output_token_logprobs"] = [[lp, tok, text(tok)] for tok, lp in zip(completion.token_ids, completion.log_probs)]
        if body.logprob_start_len >= 0 or body.top_logprobs_num:
            meta.update(sglang_scores(spec, body, completion, scores, text))
    return {"text": finish_text(server, completion, skip_special_tokens), "output_ids": completion.token_ids,
            "meta_info": meta}


def sglang_scores(spec: RowSpec, body: GenerateRequest, completion: Completion, scores, text) -> dict[str, Any]:
    """SGLang's ``input_token_logprobs`` (from ``logprob_start_len``: L - s entries, the first null),
    ``input_top_logprobs`` and ``output_top_logprobs`` (``top_logprobs_num`` > 0) from one forward's
    ``scores`` (``scored_sequence``; the output's own log-probs stay the engine's)."""
    token, top_values, top_ids = scores  # entry r: the distribution predicting position start + 1 + r
    L, s, prompt = len(spec.prompt_ids), body.logprob_start_len, spec.prompt_ids
    start = scored_from(body, L)
    out: dict[str, Any] = {}
    if s >= 0:  # s < L here means start == s
        out["input_token_logprobs"] = ([[None, prompt[s], text(prompt[s])]] if s < L else []) + [
            [token[j], prompt[s + 1 + j], text(prompt[s + 1 + j])] for j in range(L - s - 1)]
    if body.top_logprobs_num:
        rows = [[[v, i, text(i)] for v, i in zip(values, ids)] for values, ids in zip(top_values, top_ids)]
        if s >= 0:
            out["input_top_logprobs"] = ([None] if s < L else []) + rows[:max(L - s - 1, 0)]
        out["output_top_logprobs"] = rows[L - start - 1:][:len(completion.token_ids)]
    return out



async def sglang_stream(server: Server, request: Request, rid: str, rows, spec: RowSpec, body: GenerateRequest,
                        skip: bool, started: float):
    """SGLang's stream: one event per new token with the text and ids so far (cumulative, SGLang's
    default), the last one the whole output with its finish reason, then ``[DONE]``."""
    queue: asyncio.Queue = asyncio.Queue()
    try:
        (task,) = server.tasks(rid, rows, lambda j, ids, lps: queue.put_nowait(ids))
    except BadRequest as err:  # the id of a request that started since the route checked it
        yield sse({"error": {"message": err.message, "type": "BadRequestError", "param": err.param, "code": 400}})
        return
    task.add_done_callback(lambda _: queue.put_nowait(None))
    watcher = asyncio.create_task(wait_for_disconnect(request))
    watcher.add_done_callback(lambda _: queue.put_nowait(False))
    ids: list[int] = []
    loop = asyncio.get_running_loop()
    deadline = loop.time() + server.request_timeout
    try:
        while True:
            item = await asyncio.wait_for(queue.get(), max(deadline - loop.time(), 0.001))
            if item is False:
                return  # the client left: finally aborts the row
            if item is None:
                yield sse(sglang_output(server, task.result(), spec, body, skip, started))
                yield "data: [DONE]\n\n"
                return
            ids += item
            yield sse({"text": server.decode(ids, skip).rstrip("\ufffd"), "output_ids": list(ids),
                       "meta_info": {"id": rows[0].id, "finish_reason": None, "prompt_tokens": len(spec.prompt_ids),
                                     "completion_tokens": len(ids)}})
    except asyncio.TimeoutError:
        yield sse({"error": {"message": f"ran past --request-timeout {server.request_timeout:g} s; aborted",
                             "type": "TimeoutError", "param": "request", "code": 504}})
    except EngineBusy as err:
        yield sse({"error": {"message": f"the queue is full ({err}); retry later", "type": "ServiceUnavailableError",
                             "param": "server", "code": 503}})
    finally:
        watcher.cancel()
        server.aborted += int(not task.done())
        task.cancel()


def add_sglang_routes(app: FastAPI, server: Server) -> None:
    @app.post("/generate")
    async def generate(request: Request):
        started = time.perf_counter()
        body = validate(GenerateRequest, refuse_unimplemented(await read_body(request), UNIMPLEMENTED_GENERATE))
        spec, skip = sglang_spec(server, body)
        check_logprob_fields(body, len(spec.prompt_ids))
        if body.stream and spec.n > 1:
            raise BadRequest("sampling_params.n", "a streamed /generate makes one sample; use n=1, or "
                                                  "/v1/completions with stream=true")
        rid, rows = server.requests(spec, body.rid)
        if body.stream:
            server.check_room(1)
            return StreamingResponse(sglang_stream(server, request, rid, rows, spec, body, skip, started),
                                     media_type="text/event-stream")
        completions = await server.complete(request, rid, rows)
        scores = [await sequence_scores(server, body, spec, c) if body.logprob_start_len >= 0 or body.top_logprobs_num
                  else None for c in completions]
        outputs = [sglang_output(server, c, spec, body, skip, started, s) for c, s in zip(completions, scores)]
        return outputs[0] if spec.n == 1 else outputs

    @app.get("/health")
    async def health():
        if not server.engine.alive:
            return error_response(503, f"the engine has stopped: {server.engine.error!r}")
        return Response(status_code=200)

    @app.get("/health_generate")
    async def health_generate(request: Request):
        """One new token from the engine (SGLang's check that generation works, not only the process)."""
        if not server.engine.alive:
            return error_response(503, f"the engine has stopped: {server.engine.error!r}")
        first = server.tokenizer.bos_token_id if server.tokenizer.bos_token_id is not None else 0
        rid, rows = server.requests(RowSpec([first], 1, temperature=0.0), f"health-{time.monotonic_ns()}")
        await server.complete(request, rid, rows)
        return Response(status_code=200)

    @app.get("/get_model_info")
    async def get_model_info():
        return {"model_path": server.model_path, "tokenizer_path": server.model_path, "is_generation": True,
                "preferred_sampling_params": None, "weight_version": server.weight_version,
                "served_model_name": server.model_name, "max_model_len": server.max_model_len}

    @app.get("/get_weight_version")
    async def get_weight_version():
        return {"weight_version": server.weight_version}

    @app.post("/update_weights_from_disk")
    async def update_weights_from_disk(request: Request):
        body = validate(UpdateWeightsFromDisk, await read_body(request))
        if body.load_format not in (None, "auto", "safetensors"):
            raise BadRequest("load_format", f"{body.load_format!r}: rlvr loads safetensors folders (auto)")
        if body.torch_empty_cache:
            raise BadRequest("torch_empty_cache", "there is no CUDA cache to empty on this server; leave it out")
        if body.token_step:
            raise BadRequest("token_step", "is not implemented by rlvr serve; name the weights with weight_version")
        ok, message, aborted = await server.update_weights_from_disk(
            body.model_path, body.weight_version, body.abort_all_requests, body.flush_cache, body.keep_pause)
        return JSONResponse({"success": ok, "message": message, "num_paused_requests": aborted},
                            status_code=200 if ok else 400)

    add_distributed_routes(app, server)
    app.add_api_route("/update_weights_from_tensor", _not_implemented("/update_weights_from_tensor"),
                      methods=["POST"])

    @app.api_route("/flush_cache", methods=["GET", "POST"])
    async def flush_cache():
        if not await server.engine.call(server.flush):
            return PlainTextResponse("Cache not flushed: requests are running; retry when they are done.",
                                     status_code=400)
        return PlainTextResponse("Cache flushed.")

    @app.post("/abort_request")
    async def abort_request(request: Request):
        body = validate(AbortRequest, await read_body(request))
        if body.abort_all:
            n = await server.engine.abort(None)
        else:
            if not body.rid:
                raise BadRequest("rid", "give the id of the request to abort, or abort_all=true")
            n = 0
            for engine_id in server.inflight.get(body.rid, [body.rid]):
                n += await server.engine.abort(engine_id)
        server.aborted += n
        return {"success": True, "aborted": n}

    @app.post("/pause_generation")
    async def pause_generation(request: Request):
        body = validate(PauseRequest, await read_body(request))
        modes = {"abort": "abort", "in_place": "in_place", "wait": "wait"}
        if body.mode not in modes:
            raise BadRequest("mode", f"{body.mode!r}: use 'abort' (running requests end now), 'in_place' (they "
                                     "stay, paused, and continue after /continue_generation) or rlvr's 'wait' (they "
                                     "finish first); SGLang's 'retract' is not implemented")
        try:
            await server.engine.pause(modes[body.mode], deadline_s=server.request_timeout)
        except TimeoutError as err:  # 'wait': rows still run past --request-timeout; the engine stays paused
            return error_response(504, f"{err}; the engine stays paused (admitting nothing): abort them with "
                                       "/abort_request, or /continue_generation")
        return {"success": True, "message": f"paused ({body.mode})"}

    @app.post("/continue_generation")
    async def continue_generation(request: Request):
        await server.engine.resume()
        return {"success": True, "message": "continued"}

    @app.post("/release_memory_occupation")
    async def release_memory_occupation(request: Request):
        tags = _tags(validate(MemoryTags, await read_body(request)))
        if server.release is None:
            raise BadRequest("tags", "this server cannot release memory")
        if not await server.engine.call(lambda: not server.engine.core.running and not server.engine.core.waiting):
            raise BadRequest("server", "requests are running; release memory when the engine is idle "
                                       "(POST /pause_generation first)")
        server.released |= tags
        message = await server.engine.call(lambda: server.release(tags))
        return {"success": True, "message": message}

    @app.post("/resume_memory_occupation")
    async def resume_memory_occupation(request: Request):
        tags = _tags(validate(MemoryTags, await read_body(request)))
        server.released -= tags
        return {"success": True, "message": f"resumed {sorted(tags)}; what was released is rebuilt at the next "
                                            "request"}


def add_distributed_routes(app: FastAPI, server: Server) -> None:
    """SGLang's weight update over a process group (``weight_sync.py``)."""
    from rlvr.serve import weight_sync

    @app.post("/init_weights_update_group")
    async def init_weights_update_group(request: Request):
        body = validate(InitWeightsUpdateGroup, await read_body(request))
        if body.backend != "gloo":
            raise BadRequest("backend", f"{body.backend!r}: rlvr serve joins gloo groups only")
        if body.group_name in server.groups:
            raise BadRequest("group_name", f"{body.group_name!r} is open; destroy it first")
        if not (1 <= body.rank_offset < body.world_size):
            raise BadRequest("rank_offset", f"must be in [1, world_size = {body.world_size}) (rank 0 is the "
                                            f"trainer that broadcasts), got {body.rank_offset}")
        try:
            group = await in_daemon_thread(weight_sync.open_group, body.master_address, body.master_port,
                                           body.rank_offset, body.world_size, body.group_name,
                                           server.request_timeout)
        except (RuntimeError, OSError, ValueError) as err:  # the store or a rank did not answer in time
            return JSONResponse({"success": False, "message": f"could not join the group: {err}"}, status_code=400)
        server.groups[body.group_name] = group
        return {"success": True, "message": f"joined {body.group_name!r} as rank {body.rank_offset} of "
                                            f"{body.world_size}"}

    @app.post("/update_weights_from_distributed")
    async def update_weights_from_distributed(request: Request):
        body = validate(UpdateWeightsFromDistributed, await read_body(request))
        group = server.groups.get(body.group_name)
        if group is None:
            raise BadRequest("group_name", f"{body.group_name!r} is not open: POST /init_weights_update_group")
        plan = weight_sync.check_tensors(server.model, body.names, body.dtypes, body.shapes)
        # as SGLang: an engine the client paused stays paused (a trainer sends its weights in buckets
        # between /pause_generation and /continue_generation; resuming after the first bucket ran
        # the held requests on weights half old, half new)
        paused = await server.engine.call(lambda: not server.engine.core.admitting)
        ok, message, aborted = await server.update_weights(lambda: weight_sync.receive_into(group, plan),
                                                           body.weight_version, body.abort_all_requests,
                                                           body.flush_cache, keep_pause=paused)
        return JSONResponse({"success": ok, "message": message, "num_paused_requests": aborted},
                            status_code=200 if ok else 400)

    @app.post("/destroy_weights_update_group")
    async def destroy_weights_update_group(request: Request):
        body = validate(DestroyWeightsUpdateGroup, await read_body(request))
        group = server.groups.pop(body.group_name, None)
        if group is None:
            raise BadRequest("group_name", f"{body.group_name!r} is not open")
        weight_sync.close_group(group)
        return {"success": True, "message": f"left {body.group_name!r}"}


async def in_daemon_thread(fn, *args):
    """``fn(*args)`` on a daemon thread of its own -> its result. Not ``asyncio.to_thread``: a join
    whose trainer never comes blocks for --request-timeout, and ``asyncio.run`` (uvicorn's) waits for
    its default executor's threads before it returns, so SIGTERM ended the server only then."""
    loop = asyncio.get_running_loop()
    future = loop.create_future()

    def run() -> None:
        try:
            result, error = fn(*args), None
        except BaseException as err:  # handed to the awaiting route
            result, error = None, err
        with contextlib.suppress(RuntimeError):  # the loop closed meanwhile (a shutdown): nobody waits
            loop.call_soon_threadsafe(settle, future, result, error)

    threading.Thread(target=run, name="rlvr-weight-group", daemon=True).start()
    return await future


def _tags(body: MemoryTags) -> set[str]:
    tags = set(body.tags) if body.tags is not None else {"kv_cache", "weights"}
    unknown = tags - {"kv_cache", "weights"}
    if unknown:
        raise BadRequest("tags", f"{sorted(unknown)}: the tags are 'kv_cache' and 'weights'")
    return tags


def _not_implemented(route: str):
    async def refuse():
        return error_response(501, f"{route} is not implemented by rlvr serve: update weights with "
                                   "POST /update_weights_from_disk or /update_weights_from_distributed")
    return refuse


def sse(data: Any) -> str:
    return f"data: {json.dumps(data, ensure_ascii=False)}\n\n"



