"""``rlvr serve``: SGLang's and OpenAI's routes over the engine core, in process (httpx's ASGI
transport), on a real loopback socket (disconnects), and as the ``rlvr serve`` subprocess.

Expected tokens come from transformers' ``generate`` on each prompt alone (``reference_greedy``),
never from the server under test."""

import asyncio
import copy
import json
import math
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest
import torch

from rlvr.config import ConfigError
from rlvr.config.schema import RolloutConfig
from rlvr.models import load_model, load_tokenizer
from rlvr.rollout.async_engine import AsyncEngine
from rlvr.rollout.base import Completion
from rlvr.rollout.engine import NativeRollout
from rlvr.serve import Server, build_app
from rlvr.serve.openai_routes import Kind, choice
from rlvr.serve.runner import ServeOptions, check_host, weights_folder
from rlvr.serve.state import RowSpec, copy_weights_into
from tests.rollout.test_engine import prompt_ids, reference_greedy

CONTEXT = 128
QUESTIONS = ["What is 2 + 3?", "Name a colour.", "Tell me a story about a dragon who lives in a cave.", "Hi"]


@pytest.fixture(scope="module")
def tiny(tiny_model_dir):
    return load_model(tiny_model_dir), load_tokenizer(tiny_model_dir)


def make_server(model, tokenizer, path="tiny", max_num_seqs=8, max_waiting=256, timeout=60.0, api_key=None,
                context=CONTEXT):
    rollout = NativeRollout(model, tokenizer, RolloutConfig(max_num_seqs=max_num_seqs), 1)
    engine = AsyncEngine(rollout.core, max_waiting=max_waiting)
    engine.start()
    return Server(engine, tokenizer, "tiny", str(path), context, model.get_input_embeddings().weight.shape[0],
                  timeout, api_key, load_weights=lambda path: copy_weights_into(model, weights_folder(path)),
                  model=model), rollout


@pytest.fixture
def served(tiny):
    server, rollout = make_server(*tiny)
    yield server
    server.engine.stop()


def run(server, fn):
    """``fn(client)`` on a fresh event loop, the client talking to the app in process."""
    async def main():
        transport = httpx.ASGITransport(app=build_app(server))
        async with httpx.AsyncClient(transport=transport, base_url="http://rlvr", timeout=60) as client:
            return await fn(client)
    return asyncio.run(main())


def post(server, path, body):
    async def go(client):
        return await client.post(path, json=body) if not isinstance(body, bytes) else \
            await client.post(path, content=body)
    return run(server, go)


async def wait_until(predicate, deadline_s=10.0):
    end = time.monotonic() + deadline_s
    while not predicate():
        if time.monotonic() > end:
            raise AssertionError("condition not reached")
        await asyncio.sleep(0.005)


def eos_ids(tiny):
    model, tokenizer = tiny
    return NativeRollout(model, tokenizer, RolloutConfig(), 1).eos_ids


# ---------------------------------------------------------------------- same tokens as transformers
def test_generate_greedy_equals_transformers_generate(served, tiny):
    model, tokenizer = tiny
    ids = prompt_ids(tokenizer, QUESTIONS)
    for prompt in ids[:2]:
        want = reference_greedy(model, tokenizer, [prompt], 10, eos_ids(tiny))[0]
        r = post(served, "/generate", {"input_ids": prompt, "return_logprob": True,
                                       "sampling_params": {"max_new_tokens": 10, "temperature": 0}})
        assert r.status_code == 200, r.text
        out = r.json()
        assert out["output_ids"] == want
        meta = out["meta_info"]
        assert meta["prompt_tokens"] == len(prompt) and meta["completion_tokens"] == len(want)
        assert meta["weight_version"] == "default"
        assert meta["finish_reason"] == ({"type": "length", "length": 10} if len(want) == 10 else
                                         {"type": "stop", "matched": want[-1]})
        assert [entry[1] for entry in meta["output_token_logprobs"]] == want
        assert all(entry[0] <= 0 for entry in meta["output_token_logprobs"])
    # text in: the tokenizer's ids of the text, the same tokens out
    text = tokenizer.decode(ids[0])
    r = post(served, "/generate", {"text": text, "sampling_params": {"max_new_tokens": 10, "temperature": 0}})
    assert r.json()["output_ids"] == reference_greedy(model, tokenizer, [tokenizer.encode(text)], 10,
                                                      eos_ids(tiny))[0]


def test_completions_greedy_equals_transformers_generate(served, tiny):
    model, tokenizer = tiny
    prompt = prompt_ids(tokenizer, QUESTIONS)[2]
    want = reference_greedy(model, tokenizer, [prompt], 12, eos_ids(tiny))[0]
    r = post(served, "/v1/completions", {"model": "tiny", "prompt": prompt, "max_tokens": 12, "temperature": 0,
                                         "logprobs": 0, "return_token_ids": True})
    assert r.status_code == 200, r.text
    out = r.json()
    (c,) = out["choices"]
    assert c["token_ids"] == want and c["prompt_token_ids"] == prompt
    assert c["text"] == tokenizer.decode(want, skip_special_tokens=True)
    assert len(c["logprobs"]["token_logprobs"]) == len(want)
    assert out["usage"] == {"prompt_tokens": len(prompt), "completion_tokens": len(want),
                            "total_tokens": len(prompt) + len(want)}


def test_completions_stream_sends_the_greedy_tokens(served, tiny):
    model, tokenizer = tiny
    prompt = prompt_ids(tokenizer, QUESTIONS)[0]
    want = reference_greedy(model, tokenizer, [prompt], 8, eos_ids(tiny))[0]
    r = post(served, "/v1/completions", {"prompt": prompt, "max_tokens": 8, "temperature": 0, "stream": True,
                                         "stream_options": {"include_usage": True}})
    events = [line[len("data: "):] for line in r.text.splitlines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert chunks[0]["choices"][0]["prompt_token_ids"] == prompt
    # the first chunk is the first token's (as vLLM's): a client's time to first token is not an empty chunk's
    assert chunks[0]["choices"][0]["token_ids"] == want[:1]
    streamed = [t for ch in chunks for c in ch["choices"] for t in c.get("token_ids", [])]
    assert streamed == want
    assert "".join(c["text"] for ch in chunks for c in ch["choices"]) == tokenizer.decode(want,
                                                                                        skip_special_tokens=True)
    assert chunks[-1]["usage"]["completion_tokens"] == len(want)


def test_completions_stream_never_sends_a_stop_string(served, tiny):
    """A stop string ends the text before it, streamed or not: the token that completes it reaches
    the stream before the engine ends the row, and neither its characters nor the text after them
    go out (a one-character stop string was sent whole; a longer one's first characters)."""
    model, tokenizer = tiny
    prompt = prompt_ids(tokenizer, QUESTIONS)[2]
    want = reference_greedy(model, tokenizer, [prompt], 16, eos_ids(tiny))[0]
    whole = tokenizer.decode(want, skip_special_tokens=True)
    # stops that first occur inside the text: one character, and two that span a token boundary
    cut = len(tokenizer.decode(want[:len(want) // 2], skip_special_tokens=True))
    stops = [whole[cut], whole[cut - 1:cut + 1]]
    assert len(whole) > cut + 2
    for stop in stops:
        body = {"prompt": prompt, "max_tokens": 16, "temperature": 0, "stop": [stop]}
        plain = post(served, "/v1/completions", body).json()["choices"][0]["text"]
        r = post(served, "/v1/completions", {**body, "stream": True})
        events = [line[len("data: "):] for line in r.text.splitlines() if line.startswith("data: ")]
        chunks = [json.loads(e) for e in events[:-1]]
        streamed = "".join(c["text"] for ch in chunks for c in ch["choices"])
        assert plain == whole[:whole.index(stop)]  # the text before the stop string's first occurrence
        assert streamed == plain, (stop, streamed, plain)
        assert chunks[-1]["weight_version"] == "default"  # the last chunk names the weights, as a response does


def test_streamed_usage_counts_each_prompt_once_whatever_n(served, tiny):
    """vLLM's usage: a prompt's tokens count once for its n samples, streamed as not."""
    model, tokenizer = tiny
    prompt = prompt_ids(tokenizer, QUESTIONS)[0]
    body = {"prompt": prompt, "max_tokens": 4, "temperature": 1.0, "n": 3, "seed": 1}
    plain = post(served, "/v1/completions", body).json()["usage"]
    r = post(served, "/v1/completions", {**body, "stream": True, "stream_options": {"include_usage": True}})
    usage = json.loads([line for line in r.text.splitlines() if line.startswith("data: {")][-1][6:])["usage"]
    assert plain["prompt_tokens"] == usage["prompt_tokens"] == len(prompt)
    assert usage["completion_tokens"] == plain["completion_tokens"] == 12


def test_chat_completion_goes_through_the_chat_template(served, tiny):
    model, tokenizer = tiny
    messages = [{"role": "user", "content": QUESTIONS[1]}]
    prompt = prompt_ids(tokenizer, [QUESTIONS[1]])[0]  # the template's ids, computed by the test's helper
    want = reference_greedy(model, tokenizer, [prompt], 6, eos_ids(tiny))[0]
    r = post(served, "/v1/chat/completions", {"messages": messages, "max_tokens": 6, "temperature": 0,
                                              "logprobs": True})
    assert r.status_code == 200, r.text
    out = r.json()
    assert out["prompt_token_ids"] == prompt
    assert out["choices"][0]["token_ids"] == want
    assert [e["logprob"] <= 0 for e in out["choices"][0]["logprobs"]["content"]] == [True] * len(want)


def test_chat_tool_calls_come_from_rlvrs_parser(served, tiny):
    """A turn that writes a hermes call becomes ``tool_calls`` with the JSON arguments as text and
    finish reason ``tool_calls``; the text before the call stays the content."""
    from rlvr.tools.schema import OpenAIFunctionToolSchema

    _, tokenizer = tiny
    tool = {"type": "function", "function": {"name": "calculator", "description": "math",
                                             "parameters": {"type": "object", "properties": {
                                                 "expression": {"type": "string"}}, "required": ["expression"]}}}
    text = 'Let me compute.<tool_call>{"name": "calculator", "arguments": {"expression": "2+3"}}</tool_call>'
    ids = tokenizer.encode(text, add_special_tokens=False)
    kind = Kind("chatcmpl", "chat.completion", chat=True, logprobs=False,
                tools=[OpenAIFunctionToolSchema.from_dict(tool)])
    out = choice(served, 0, Completion(ids, [0.0] * len(ids), "stop", matched="</tool_call>"),
                 RowSpec([1], 8), kind, True)
    assert out["finish_reason"] == "tool_calls"
    assert out["message"]["content"] == "Let me compute."
    (call,) = out["message"]["tool_calls"]
    assert call["function"] == {"name": "calculator", "arguments": '{"expression": "2+3"}'}
    # the route hands the tools to the chat template: the prompt is the template's with the tools
    r = post(served, "/v1/chat/completions", {"messages": [{"role": "user", "content": "2+3?"}], "tools": [tool],
                                              "max_tokens": 2, "temperature": 0})
    want = tokenizer.encode(tokenizer.apply_chat_template([{"role": "user", "content": "2+3?"}], tools=[tool],
                                                          add_generation_prompt=True, tokenize=False),
                            add_special_tokens=False)
    assert r.json()["prompt_token_ids"] == want


def test_64_concurrent_openai_client_requests(tiny):
    """The real openai client, 64 requests at once into 8 rows: each gets its prompt's greedy tokens."""
    import openai

    model, tokenizer = tiny
    server, _ = make_server(model, tokenizer, max_num_seqs=8)
    prompts = prompt_ids(tokenizer, QUESTIONS)
    budgets = [4, 7, 10, 13]
    want = {(p, b): reference_greedy(model, tokenizer, [prompts[p]], b, eos_ids(tiny))[0]
            for p in range(4) for b in budgets}

    async def main():
        http = httpx.AsyncClient(transport=httpx.ASGITransport(app=build_app(server)), timeout=120)
        client = openai.AsyncOpenAI(base_url="http://rlvr/v1", api_key="none", http_client=http, max_retries=0)
        jobs = [(i % 4, budgets[(i // 4) % 4]) for i in range(64)]
        results = await asyncio.gather(*(client.completions.create(
            model="tiny", prompt=prompts[p], max_tokens=b, temperature=0, extra_body={"return_token_ids": True})
            for p, b in jobs))
        await http.aclose()
        return jobs, results

    try:
        jobs, results = asyncio.run(main())
    finally:
        server.engine.stop()
    assert len(results) == 64
    for (p, b), result in zip(jobs, results):
        assert result.choices[0].model_extra["token_ids"] == want[(p, b)], (p, b)


# ---------------------------------------------------------------------- aborts, pauses, weights
def test_abort_mid_generation_frees_the_row(served, tiny):
    """A request decoding (held in place by a pause) is aborted by rid: it answers with finish
    reason abort and its tokens so far, and the engine has no running row left."""
    _, tokenizer = tiny
    core = served.engine.core

    async def go(client):
        long = asyncio.create_task(client.post("/generate", json={
            "input_ids": prompt_ids(tokenizer, QUESTIONS)[0], "rid": "long",
            "sampling_params": {"max_new_tokens": 60, "ignore_eos": True, "temperature": 0}}))
        await wait_until(lambda: len(core.running) == 1 and len(core.running[0].tokens) >= 2)
        await client.post("/pause_generation", json={"mode": "in_place"})
        r = await client.post("/abort_request", json={"rid": "long"})
        assert r.json()["aborted"] == 1
        out = (await long).json()
        await client.post("/continue_generation", json={})
        return out

    out = run(served, go)
    assert out["meta_info"]["finish_reason"]["type"] == "abort"
    assert 2 <= out["meta_info"]["completion_tokens"] < 60
    assert core.running == [] and not core.waiting and served.inflight == {}


def perturbed(model):
    """The model's weights, each moved by noise of a fixed seed: a policy whose greedy tokens differ."""
    new_model = copy.deepcopy(model)
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in new_model.parameters():
            p.add_(torch.randn(p.shape, generator=generator) * p.std())
    return new_model


def test_update_weights_from_disk_moves_tokens_and_version(tiny, tmp_path):
    model, tokenizer = tiny
    mine = copy.deepcopy(model)
    server, _ = make_server(mine, tokenizer)
    new_model = perturbed(model)
    new_dir = tmp_path / "new"
    new_model.save_pretrained(new_dir)
    prompt = tokenizer.encode("Once upon a time")
    old_want = reference_greedy(model, tokenizer, [prompt], 8, eos_ids(tiny))[0]
    new_want = reference_greedy(new_model, tokenizer, [prompt], 8, eos_ids(tiny))[0]
    assert old_want != new_want  # the two seeds' models disagree, or the test proves nothing
    body = {"input_ids": prompt, "sampling_params": {"max_new_tokens": 8, "temperature": 0}}

    async def go(client):
        before = (await client.post("/generate", json=body)).json()
        refused = await client.post("/update_weights_from_disk", json={"model_path": str(tmp_path / "none"),
                                                                        "weight_version": "bad"})
        after_refusal = (await client.post("/generate", json=body)).json()
        ok = await client.post("/update_weights_from_disk", json={"model_path": str(new_dir),
                                                                   "weight_version": "step-1"})
        version = (await client.get("/get_weight_version")).json()
        after = (await client.post("/generate", json=body)).json()
        return before, refused, after_refusal, ok, version, after

    try:
        before, refused, after_refusal, ok, version, after = run(server, go)
    finally:
        server.engine.stop()
    assert before["output_ids"] == old_want and before["meta_info"]["weight_version"] == "default"
    assert refused.status_code == 400 and refused.json()["success"] is False
    assert after_refusal["output_ids"] == old_want  # a refused folder changes nothing
    assert ok.status_code == 200 and ok.json()["success"] is True, ok.text
    assert version == {"weight_version": "step-1"}
    assert after["output_ids"] == new_want and after["meta_info"]["weight_version"] == "step-1"


def test_an_update_crosses_a_request_held_in_place(tiny, tmp_path):
    """SGLang's partial-rollout flow: /pause_generation in place, an update, /continue_generation.
    The held request keeps its tokens so far and goes on under the new weights (it is not run to
    its end on the old ones first), and says where the new version's tokens start."""
    model, tokenizer = tiny
    server, _ = make_server(copy.deepcopy(model), tokenizer)
    core = server.engine.core
    new_model = perturbed(model)
    new_model.save_pretrained(tmp_path / "new")
    prompt = prompt_ids(tokenizer, QUESTIONS)[0]
    body = {"input_ids": prompt, "sampling_params": {"max_new_tokens": 40, "ignore_eos": True, "temperature": 0}}

    async def go(client):
        long = asyncio.create_task(client.post("/generate", json=body))
        await wait_until(lambda: len(core.running) == 1 and len(core.running[0].tokens) >= 3)
        await client.post("/pause_generation", json={"mode": "in_place"})
        ok = await client.post("/update_weights_from_disk", json={"model_path": str(tmp_path / "new"),
                                                                   "weight_version": "step-1", "keep_pause": True})
        held = len(core.running[0].tokens)
        await client.post("/continue_generation", json={})
        return ok, held, (await long).json()

    try:
        ok, held, out = run(server, go)
    finally:
        server.engine.stop()
    assert ok.json()["success"] is True, ok.text
    assert "the KV slab is kept: requests are running" in ok.json()["message"]  # the held row's cache stays
    assert 3 <= held < 40
    ids = out["output_ids"]
    assert len(ids) == 40 and out["meta_info"]["weight_version"] == "step-1"
    # the first token after the update comes from logits the old weights computed before the pause
    assert out["meta_info"]["weight_version_starts"] == [[0, "default"], [held + 1, "step-1"]]
    old = held + 1
    assert ids[:old] == reference_greedy(model, tokenizer, [prompt], old, [])[0]  # the old policy's
    # after them, the new policy's greedy tokens, attending to the keys and values the old weights
    # wrote (as in SGLang: an in-place update keeps the cache): the old model reads the prompt and
    # the tokens fed before the pause, then a model feeds the engine's tokens one by one; each must
    # be that model's argmax, up to the two implementations' fp32 arithmetic (1e-5 of the largest
    # logit: the perturbed model's reach the hundreds)
    def greedy_gaps(continuing):
        with torch.no_grad():
            cache = model(torch.tensor([prompt + ids[:old - 1]]), use_cache=True).past_key_values
            gaps = []
            for fed, sampled in zip(ids[old - 1:-1], ids[old:]):
                out_ = continuing(torch.tensor([[fed]]), past_key_values=cache, use_cache=True)
                cache, logits = out_.past_key_values, out_.logits[0, -1]
                gaps.append(float((logits.max() - logits[sampled]) / logits.abs().max()))
        return gaps

    assert max(greedy_gaps(new_model)) < 1e-5
    assert max(greedy_gaps(model)) > 1e-2  # the old weights would not have chosen them: the test tells the two apart


def test_update_weights_from_distributed_moves_tokens_and_version(tiny):
    """SGLang's flow on gloo over 127.0.0.1: the trainer (rank 0, here a thread with its own group
    object) hosts the store, both join, the trainer broadcasts every parameter of a new policy
    while the server receives them; greedy tokens become the new policy's and the version moves.
    A name the model lacks is refused before any tensor is sent."""
    from rlvr.serve.weight_sync import broadcast, open_group

    model, tokenizer = tiny
    server, _ = make_server(copy.deepcopy(model), tokenizer)
    new_model = perturbed(model)
    prompt = tokenizer.encode("Once upon a time")
    new_want = reference_greedy(new_model, tokenizer, [prompt], 8, eos_ids(tiny))[0]
    assert new_want != reference_greedy(model, tokenizer, [prompt], 8, eos_ids(tiny))[0]
    params = list(new_model.named_parameters())  # tied weights once
    port = free_port()
    update = {"names": [n for n, _ in params], "dtypes": [str(p.dtype) for _, p in params],
              "shapes": [list(p.shape) for _, p in params], "group_name": "g", "weight_version": "step-2"}
    body = {"input_ids": prompt, "sampling_params": {"max_new_tokens": 8, "temperature": 0}}

    async def go(client):
        joined = asyncio.create_task(client.post("/init_weights_update_group", json={
            "master_address": "127.0.0.1", "master_port": port, "rank_offset": 1, "world_size": 2,
            "group_name": "g", "backend": "gloo"}))
        trainer = await asyncio.to_thread(open_group, "127.0.0.1", port, 0, 2, "g", 30.0, True)
        joined = await joined
        wrong = await client.post("/update_weights_from_distributed", json={**update, "names": ["nope"],
                                                                            "dtypes": ["float32"], "shapes": [[1]]})
        updated = asyncio.create_task(client.post("/update_weights_from_distributed", json=update))
        await asyncio.to_thread(lambda: [broadcast(trainer, p.detach().clone()) for _, p in params])
        updated = await updated
        after = (await client.post("/generate", json=body)).json()
        left = await client.post("/destroy_weights_update_group", json={"group_name": "g"})
        return joined, wrong, updated, after, left

    try:
        joined, wrong, updated, after, left = run(server, go)
    finally:
        server.engine.stop()
    assert joined.status_code == 200 and joined.json()["success"], joined.text
    assert wrong.status_code == 400 and wrong.json()["error"]["param"] == "names.0"
    assert updated.status_code == 200 and updated.json()["success"], updated.text
    assert after["output_ids"] == new_want and after["meta_info"]["weight_version"] == "step-2"
    assert left.status_code == 200 and server.groups == {}


# ---------------------------------------------------------------------- bad input: one test each
def test_unimplemented_field_is_refused_by_name(served):
    r = post(served, "/v1/completions", {"prompt": "Hi", "max_tokens": 2, "frequency_penalty": 0.5})
    assert r.status_code == 400 and r.json()["error"]["param"] == "frequency_penalty"
    r = post(served, "/generate", {"text": "Hi", "sampling_params": {"regex": "[0-9]+"}})
    assert r.status_code == 400 and r.json()["error"]["param"] == "sampling_params.regex"
    r = post(served, "/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}], "foo": 1})
    assert r.status_code == 400 and r.json()["error"]["param"] == "foo"
    # at its neutral value the field changes nothing, so it is accepted
    r = post(served, "/v1/completions", {"prompt": "Hi", "max_tokens": 2, "frequency_penalty": 0})
    assert r.status_code == 200, r.text


def test_malformed_json_is_refused(served):
    r = post(served, "/v1/completions", b'{"prompt": "Hi",')
    assert r.status_code == 400 and r.json()["error"]["param"] == "body"
    r = post(served, "/generate", b"[1, 2]")
    assert r.status_code == 400 and "JSON object" in r.json()["error"]["message"]


def test_prompt_longer_than_the_context_is_refused(served):
    r = post(served, "/v1/completions", {"prompt": [5] * CONTEXT, "max_tokens": 1})
    assert r.status_code == 400 and r.json()["error"]["param"] == "prompt"
    # 100 prompt tokens + 29 new ones = 129 > 128: refused naming max_tokens; 28 fit
    r = post(served, "/v1/completions", {"prompt": [5] * 100, "max_tokens": 29})
    assert r.status_code == 400 and r.json()["error"]["param"] == "max_tokens"
    assert "at most 28" in r.json()["error"]["message"]


def test_max_tokens_below_one_is_refused(served):
    r = post(served, "/v1/completions", {"prompt": "Hi", "max_tokens": 0})
    assert r.status_code == 400 and r.json()["error"]["param"] == "max_tokens"
    r = post(served, "/generate", {"text": "Hi", "sampling_params": {"max_new_tokens": 0}})
    assert r.status_code == 400 and r.json()["error"]["param"] == "sampling_params.max_new_tokens"


def test_token_id_outside_the_vocabulary_is_refused(served, tiny):
    vocab = tiny[0].get_input_embeddings().weight.shape[0]
    r = post(served, "/generate", {"input_ids": [1, vocab], "sampling_params": {"max_new_tokens": 1}})
    assert r.status_code == 400 and r.json()["error"]["param"] == "input_ids"
    assert f"token id {vocab} is outside" in r.json()["error"]["message"]
    r = post(served, "/v1/completions", {"prompt": [-1], "max_tokens": 1})
    assert r.status_code == 400 and r.json()["error"]["param"] == "prompt"


def test_bad_n_is_refused(served):
    r = post(served, "/v1/completions", {"prompt": "Hi", "max_tokens": 1, "n": 0})
    assert r.status_code == 400 and r.json()["error"]["param"] == "n"
    r = post(served, "/generate", {"text": "Hi", "sampling_params": {"n": 100000}})
    assert r.status_code == 400 and r.json()["error"]["param"] == "sampling_params.n"


def test_bad_temperature_is_refused(served):
    r = post(served, "/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}], "temperature": -0.5})
    assert r.status_code == 400 and r.json()["error"]["param"] == "temperature"
    r = post(served, "/generate", {"text": "Hi", "sampling_params": {"temperature": "hot"}})
    assert r.status_code == 400 and r.json()["error"]["param"] == "sampling_params.temperature"


def test_a_tiny_temperature_or_top_p_is_greedy_not_a_dead_engine(served, tiny):
    """temperature 1e-50 made every log-prob NaN and the sampler pick a token past the vocabulary,
    which killed the engine thread (every later request 500); top_p 1e-50 dropped every token. As in
    vLLM, a temperature below 1e-5 is greedy, and top-p keeps the most likely token: both give
    transformers' greedy tokens, and the engine answers after them."""
    model, tokenizer = tiny
    prompt = prompt_ids(tokenizer, QUESTIONS)[0]
    want = reference_greedy(model, tokenizer, [prompt], 6, eos_ids(tiny))[0]
    for sampling in ({"temperature": 1e-50}, {"temperature": 1.0, "top_p": 1e-50}):
        r = post(served, "/generate", {"input_ids": prompt, "return_logprob": True,
                                       "sampling_params": {"max_new_tokens": 6, **sampling}})
        assert r.status_code == 200, r.text
        assert r.json()["output_ids"] == want, sampling
        assert all(math.isfinite(lp) for lp, _, _ in r.json()["meta_info"]["output_token_logprobs"])
    assert served.engine.alive


@pytest.mark.parametrize("route,body,param", [
    ("/v1/completions", {"prompt": "Hi", "stop": [""]}, "stop"),
    ("/generate", {"text": "Hi", "sampling_params": {"stop": ""}}, "sampling_params.stop"),
    ("/generate", {"text": "Hi", "sampling_params": {"sampling_seed": 2 ** 64}}, "sampling_params.sampling_seed"),
    ("/v1/completions", {"prompt": "Hi", "seed": -(2 ** 70)}, "seed"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}],
                              "chat_template_kwargs": {"chat_template": "{% for i in range(9) %}x{% endfor %}"}},
     "chat_template_kwargs.chat_template"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}], "tools": [{"type": "function",
      "function": {"name": "f", "parameters": {"type": "object", "properties": {"x": {"type": {"a": 1}}}}}}]},
     "tools.0.function.parameters.properties.x.type"),
])
def test_inputs_that_failed_deep_inside_get_a_400_naming_the_field(served, route, body, param):
    """An empty stop string (every request stopped at its first token, with empty text), a seed torch
    cannot take (500), a template of the client's own (run on the server), a tool schema whose type
    is a mapping (500)."""
    r = post(served, route, body)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param


def test_two_requests_of_one_id_never_share_a_prefill(served, tiny):
    """Each request's rows are a group of their own: two that got past the id check together were
    admitted as one group, the second's rows decoding the first's prompt."""
    from rlvr.serve.state import RowSpec

    _, tokenizer = tiny
    a, b = prompt_ids(tokenizer, QUESTIONS)[:2]
    spec = lambda prompt: RowSpec(prompt, 4, 0.0, 1.0, -1, 0.0, (), (), False, 1, None)  # noqa: E731
    (_, (first,)), (_, (second,)) = served.requests(spec(a), "same"), served.requests(spec(b), "same")
    assert first.group != second.group


def test_full_queue_answers_503_with_retry_after(tiny):
    """Two requests may wait; the engine is paused, so a third finds the queue full."""
    server, _ = make_server(*tiny, max_waiting=2)
    core = server.engine.core

    async def go(client):
        await client.post("/pause_generation", json={"mode": "abort"})
        body = {"text": "Hi", "sampling_params": {"max_new_tokens": 2}}
        waiting = [asyncio.create_task(client.post("/generate", json=body)) for _ in range(2)]
        await wait_until(lambda: len(core.waiting) == 2)
        third = await client.post("/generate", json=body)
        streamed = await client.post("/v1/completions", json={"prompt": "Hi", "max_tokens": 2, "stream": True})
        await client.post("/continue_generation", json={})
        return third, streamed, [await w for w in waiting]

    try:
        third, streamed, first_two = run(server, go)
    finally:
        server.engine.stop()
    assert third.status_code == 503 and third.headers["retry-after"] == "1"
    assert streamed.status_code == 503 and streamed.headers["retry-after"] == "1"  # before the stream starts
    assert [r.status_code for r in first_two] == [200, 200]


def test_request_past_the_timeout_is_aborted(tiny):
    server, _ = make_server(*tiny, timeout=0.3)
    core = server.engine.core

    async def go(client):
        await client.post("/pause_generation", json={"mode": "in_place"})  # nothing decodes: it must time out
        r = await client.post("/generate", json={"text": "Hi", "sampling_params": {"max_new_tokens": 50}})
        await client.post("/continue_generation", json={})
        return r

    try:
        r = run(server, go)
    finally:
        server.engine.stop()
    assert r.status_code == 504 and "--request-timeout 0.3" in r.json()["error"]["message"]
    assert core.running == [] and not core.waiting


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Uvicorn:
    """The app of ``server`` (or an ASGI ``app``) on a real loopback socket, uvicorn on a thread of
    this process."""

    def __init__(self, server=None, app=None):
        import uvicorn

        self.port = free_port()
        self.uv = uvicorn.Server(uvicorn.Config(app or build_app(server), host="127.0.0.1", port=self.port,
                                               log_level="error"))
        self.thread = threading.Thread(target=self.uv.run, daemon=True)

    def __enter__(self):
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.uv.started:
            assert time.monotonic() < deadline, "uvicorn did not start"
            time.sleep(0.02)
        return f"http://127.0.0.1:{self.port}"

    def __exit__(self, *exc):
        self.uv.should_exit = True
        self.thread.join(10)


def wait_idle(server, deadline_s=10.0):
    end = time.monotonic() + deadline_s
    while (server.engine.core.running or server.inflight) and time.monotonic() < end:
        time.sleep(0.02)


def test_client_that_disconnects_from_a_stream_has_its_request_aborted(tiny):
    """A real socket: the client reads three events of a long stream and closes it; the server
    aborts the request and frees its row."""
    server, _ = make_server(*tiny, context=2048)
    try:
        with Uvicorn(server) as base:
            with httpx.stream("POST", f"{base}/v1/completions", json={
                    "prompt": "Hi", "max_tokens": 1900, "ignore_eos": True, "stream": True}, timeout=30) as r:
                events = []
                for line in r.iter_lines():
                    events += [line] if line.startswith("data: ") else []
                    if len(events) == 3:
                        break  # leaving the block closes the connection
            assert len(events) == 3 and "[DONE]" not in events[-1]
            wait_idle(server)
            assert server.engine.core.running == [] and server.inflight == {} and server.aborted == 1
    finally:
        server.engine.stop()


def test_client_that_disconnects_has_its_request_aborted(tiny):
    """A real socket: the client gives up after 1 s on a request held in place; the server
    notices the disconnect, aborts the request and frees its row."""
    server, _ = make_server(*tiny, context=2048)  # room for a request that runs long enough to be caught
    core = server.engine.core
    uv = Uvicorn(server)
    base = uv.__enter__()
    try:
        prompt = prompt_ids(tiny[1], QUESTIONS)[0]

        def pause_when_running():
            end = time.monotonic() + 10
            while not core.running and time.monotonic() < end:
                time.sleep(0.002)
            httpx.post(f"{base}/pause_generation", json={"mode": "in_place"})

        pauser = threading.Thread(target=pause_when_running)
        pauser.start()
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(f"{base}/generate", json={"input_ids": prompt, "sampling_params": {
                "max_new_tokens": 1900, "ignore_eos": True}}, timeout=1.0)
        pauser.join()
        wait_idle(server)
        assert core.running == [] and server.inflight == {} and server.aborted == 1
        httpx.post(f"{base}/continue_generation", json={})
    finally:
        uv.__exit__()
        server.engine.stop()


def test_api_key_is_required_on_every_route(tiny):
    server, _ = make_server(*tiny, api_key="sekret")

    async def go(client):
        bare = await client.get("/health")
        wrong = await client.post("/v1/completions", json={"prompt": "Hi", "max_tokens": 1},
                                  headers={"Authorization": "Bearer nope"})
        right = await client.post("/v1/completions", json={"prompt": "Hi", "max_tokens": 1},
                                  headers={"Authorization": "Bearer sekret"})
        return bare, wrong, right

    try:
        bare, wrong, right = run(server, go)
    finally:
        server.engine.stop()
    assert bare.status_code == 401 and wrong.status_code == 401 and right.status_code == 200


def test_another_host_needs_an_api_key(capsys):
    from rlvr.cli import main

    # refused before the model loads (a path that does not exist would be the error otherwise)
    assert main(["serve", "--host", "0.0.0.0", "actor_rollout_ref.model.path=/nonexistent"]) == 2
    assert "--host 0.0.0.0: a server reachable from other machines needs --api-key" in capsys.readouterr().err
    with pytest.raises(ConfigError, match="--api-key"):
        check_host(ServeOptions(host="0.0.0.0"))
    check_host(ServeOptions(host="0.0.0.0", api_key="k"))
    check_host(ServeOptions(host="::1"))
    check_host(ServeOptions(host="localhost"))


def test_a_port_in_use_or_out_of_range_is_refused_before_the_model_loads(capsys):
    """A port another process listens on: refused naming --host and --port, before the model loads
    (it printed "on http://..." and then uvicorn's bind error, once the model had loaded); a port
    past 65535: refused by name (it printed the address and then "stopped", with no error)."""
    import socket

    from rlvr.cli import main

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert main(["serve", "--port", str(port), "actor_rollout_ref.model.path=/nonexistent"]) == 2
        err = capsys.readouterr().err
        assert f"--host 127.0.0.1 --port {port}: cannot listen there (Address already in use)" in err
        assert "nonexistent" not in err and "Traceback" not in err
    with pytest.raises(SystemExit):
        main(["serve", "--port", "99999"])
    assert "argument --port: must be <= 65535, got 99999" in capsys.readouterr().err


# ---------------------------------------------------------------------- the real command
def test_rlvr_serve_subprocess_answers_and_stops_on_sigterm(tiny_model_dir, tmp_path):
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    cmd = [sys.executable, "-m", "rlvr.cli", "serve", f"actor_rollout_ref.model.path={tiny_model_dir}",
           f"trainer.default_local_dir={tmp_path}", "--port", str(port), "--max-model-len", "2048"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 120
        while True:
            assert proc.poll() is None, proc.communicate()[1][-2000:]
            assert time.monotonic() < deadline, "rlvr serve did not answer /health in 120 s"
            try:
                if httpx.get(f"{base}/health", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.2)
        r = httpx.post(f"{base}/v1/completions", json={"prompt": "Hi", "max_tokens": 3, "temperature": 0}, timeout=30)
        assert r.status_code == 200 and len(r.json()["choices"][0]["token_ids"]) == 3, r.text
        # a long request in flight when SIGTERM comes: it is aborted and answered, then the server exits
        answers = []
        long = threading.Thread(target=lambda: answers.append(httpx.post(f"{base}/generate", json={
            "text": "Hi", "sampling_params": {"max_new_tokens": 1900, "ignore_eos": True}}, timeout=60)))
        long.start()
        time.sleep(0.5)
        os.kill(proc.pid, signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
        long.join(10)
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 0, err[-2000:]
    assert "rlvr serve: stopped" in err
    (answer,) = answers
    meta = answer.json()["meta_info"]
    assert meta["finish_reason"]["type"] == "abort" and meta["completion_tokens"] < 1900


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")  # the thread re-raises, as it should
def test_a_command_queued_when_the_engine_thread_dies_is_answered_with_the_reason():
    """A caller awaiting a pause, flush or abort queued while a step fails hears why, instead of
    waiting forever (routes without a timeout would hang); one posted after the thread ended too."""
    started, release = threading.Event(), threading.Event()

    class FailingCore:
        on_sampled, running, waiting = None, [], []

        def has_work(self):
            return True

        def step(self):
            started.set()
            release.wait(10)
            raise RuntimeError("the step failed")

        def abort_all(self):
            return 0

    engine = AsyncEngine(FailingCore())

    async def go():
        engine.start()
        assert await asyncio.to_thread(started.wait, 10)
        pending = asyncio.ensure_future(engine.call(lambda: "never"))
        await asyncio.sleep(0.05)  # queued behind the step
        release.set()
        with pytest.raises(RuntimeError, match="engine thread has stopped: RuntimeError..the step failed"):
            await asyncio.wait_for(pending, 10)
        with pytest.raises(RuntimeError, match="engine thread has stopped"):
            await asyncio.wait_for(engine.call(lambda: "never"), 10)

    asyncio.run(go())


def test_a_request_cancelled_before_its_add_runs_is_aborted(tiny):
    """The engine thread is busy (a command that sleeps), so a cancelled request's add is still
    queued when it is cancelled: the abort must come after the add, not be skipped (the request
    decoded its 1900 tokens for nobody before)."""
    from rlvr.rollout.core import Request
    from rlvr.rollout.sampling import SamplingParams

    server, _ = make_server(*tiny, context=2048)
    core = server.engine.core
    prompt = prompt_ids(tiny[1], QUESTIONS)[0]

    async def go():
        server.engine._post_nowait(lambda: time.sleep(0.3))
        task = asyncio.create_task(server.engine.generate(Request("orphan", prompt, SamplingParams(
            max_new_tokens=1900, do_sample=False), ignore_eos=True)))
        await asyncio.sleep(0.05)  # the task waits on its queued add
        task.cancel()
        await asyncio.sleep(0.5)  # the sleep, the add and what follows it have run
        return await server.engine.call(lambda: (len(core.running), len(core.waiting)))

    try:
        assert asyncio.run(go()) == (0, 0)
    finally:
        server.engine.stop()


def test_weight_group_meets_a_trainer_that_opens_its_side_with_torchs_helpers():
    """The trainer's side built as SGLang's ``init_custom_process_group`` builds it (torch's tcp://
    rendezvous and its group helper), the server's by ``open_group``: the broadcast arrives."""
    import datetime

    from torch.distributed.distributed_c10d import _new_process_group_helper, rendezvous

    from rlvr.serve.weight_sync import broadcast, open_group

    port = free_port()
    received = torch.zeros(4)
    server_side = threading.Thread(target=lambda: broadcast(open_group("127.0.0.1", port, 1, 2, "weight_update_group",
                                                                       30.0), received))
    server_side.start()
    timeout = datetime.timedelta(seconds=30)
    store, _, _ = next(rendezvous(f"tcp://127.0.0.1:{port}", 0, 2, timeout=timeout))
    group, _ = _new_process_group_helper(2, 0, [], "gloo", store, group_name="weight_update_group", timeout=timeout)
    group.broadcast([torch.arange(4.0)]).wait()
    server_side.join(30)
    assert received.tolist() == [0.0, 1.0, 2.0, 3.0]


def test_chat_stream_sends_the_greedy_tokens(served, tiny):
    model, tokenizer = tiny
    prompt = prompt_ids(tokenizer, [QUESTIONS[0]])[0]
    want = reference_greedy(model, tokenizer, [prompt], 6, eos_ids(tiny))[0]
    r = post(served, "/v1/chat/completions", {"messages": [{"role": "user", "content": QUESTIONS[0]}],
                                              "max_tokens": 6, "temperature": 0, "stream": True})
    events = [line[len("data: "):] for line in r.text.splitlines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert chunks[0]["prompt_token_ids"] == prompt and chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    assert [t for ch in chunks for c in ch["choices"] for t in c.get("token_ids", [])] == want
    text = "".join(c["delta"].get("content", "") for ch in chunks for c in ch["choices"])
    assert text == tokenizer.decode(want, skip_special_tokens=True)
    assert chunks[-1]["choices"][0]["finish_reason"] == ("length" if len(want) == 6 else "stop")


def test_sampled_n_rows_equal_the_batch_engine_with_the_same_seed(served, tiny):
    """``n`` = 3 samples with ``sampling_seed`` 7 draw rows 0..2 of seed 7's uniforms, as the batch
    engine's three rows of one prompt do: the same tokens. The same request again: the same tokens."""
    from rlvr.rollout.sampling import SamplingParams

    model, tokenizer = tiny
    prompt = prompt_ids(tokenizer, QUESTIONS)[1]
    engine = NativeRollout(model, tokenizer, RolloutConfig(), 1)
    want = [c.token_ids for c in engine.generate([prompt] * 3, SamplingParams(max_new_tokens=10, seed=7))]
    body = {"input_ids": prompt, "sampling_params": {"max_new_tokens": 10, "n": 3, "sampling_seed": 7}}
    first, again = post(served, "/generate", body).json(), post(served, "/generate", body).json()
    assert [o["output_ids"] for o in first] == want
    assert [o["output_ids"] for o in again] == want
    assert len({tuple(w) for w in want}) > 1  # the rows sampled differently, or the test shows nothing


def test_generate_stream_sends_the_greedy_tokens(served, tiny):
    """SGLang's stream: cumulative text and ids per event, the last the whole output, then [DONE]."""
    model, tokenizer = tiny
    prompt = prompt_ids(tokenizer, QUESTIONS)[3]
    want = reference_greedy(model, tokenizer, [prompt], 7, eos_ids(tiny))[0]
    r = post(served, "/generate", {"input_ids": prompt, "stream": True,
                                   "sampling_params": {"max_new_tokens": 7, "temperature": 0}})
    events = [line[len("data: "):] for line in r.text.splitlines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert [c["output_ids"] for c in chunks[:-1]] == [want[:k] for k in range(1, len(want) + 1)]
    assert chunks[-1]["output_ids"] == want and chunks[-1]["meta_info"]["finish_reason"]["type"] in ("stop", "length")
    assert chunks[-1]["text"] == tokenizer.decode(want, skip_special_tokens=True)


def test_generate_returns_prompt_log_probs_as_sglang_does(served, tiny):
    """SGLang's ``logprob_start_len`` s and ``top_logprobs_num`` k: L - s prompt entries, the first
    null, entry j the log-prob of prompt[s + j] given what precedes it; the top-k of each of those
    distributions, and of the output's; all equal to one plain forward of the model."""
    model, tokenizer = tiny
    prompt = prompt_ids(tokenizer, QUESTIONS[:1])[0]
    L, s, k = len(prompt), 5, 3
    r = post(served, "/generate", {"input_ids": prompt, "return_logprob": True, "logprob_start_len": s,
                                   "top_logprobs_num": k, "sampling_params": {"max_new_tokens": 2, "temperature": 0}})
    assert r.status_code == 200, r.text
    out = r.json()
    meta, output = out["meta_info"], out["output_ids"]
    with torch.no_grad():
        logp = torch.log_softmax(model(torch.tensor([prompt + output])).logits[0].float(), -1)  # (L + 2, V)
    entries = meta["input_token_logprobs"]
    assert len(entries) == L - s and entries[0] == [None, prompt[s], None]
    for j in range(1, L - s):
        assert entries[j][1] == prompt[s + j]
        assert entries[j][0] == pytest.approx(float(logp[s + j - 1, prompt[s + j]]), abs=1e-5)
    tops = meta["input_top_logprobs"]
    assert len(tops) == L - s and tops[0] is None
    values, ids = logp.topk(k, dim=-1)
    for j in range(1, L - s):
        assert [e[1] for e in tops[j]] == ids[s + j - 1].tolist()
        assert [e[0] for e in tops[j]] == pytest.approx(values[s + j - 1].tolist(), abs=1e-5)
    out_tops = meta["output_top_logprobs"]
    assert len(out_tops) == 2
    assert [e[1] for e in out_tops[0]] == ids[L - 1].tolist() and out_tops[0][0][1] == output[0]  # greedy: its argmax
    assert [e[1] for e in out_tops[1]] == ids[L].tolist()
    # refused by name: the fields without return_logprob, a start past the prompt, a negative k
    for body, param in (({"logprob_start_len": 0}, "return_logprob"),
                        ({"return_logprob": True, "logprob_start_len": L + 1}, "logprob_start_len"),
                        ({"return_logprob": True, "top_logprobs_num": -1}, "top_logprobs_num")):
        r = post(served, "/generate", {"input_ids": prompt, "sampling_params": {"max_new_tokens": 1}, **body})
        assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text


@pytest.mark.parametrize("route,body,param,forms", [
    ("/v1/completions", {"prompt": 5, "max_tokens": 1}, "prompt", "str, list[int], list[str], list[list[int]]"),
    ("/v1/completions", {"prompt": [[1], "a"], "max_tokens": 1}, "prompt", "list[list[int]]"),
    ("/generate", {"text": "Hi", "sampling_params": {"stop": 5}}, "sampling_params.stop", "str, list[str]"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}], "tool_choice": "required"},
     "tool_choice", "'none'"),
])
def test_a_field_of_several_forms_is_named_without_pydantics_member_tags(served, route, body, param, forms):
    """A value that fits none of a union field's forms: ``param`` is the field (it was ``prompt.str``,
    ``tool_choice.literal['none','auto']``: pydantic's name of the first form tried), and the
    message lists the forms the field takes."""
    r = post(served, route, body)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param
    assert forms in r.json()["error"]["message"]


def test_completion_log_probs_have_vllms_shape_streamed_or_not(served, tiny):
    """vLLM's ``CompletionLogProbs`` for ``logprobs`` = 0: ``top_logprobs`` a list with one
    ``{token: logprob}`` per token (the sampled token's; it was null), and ``text_offset`` each
    token's offset in the whole text, streamed too (vLLM starts a chunk's offsets at the length of the
    text before it; every chunk restarted at 0)."""
    model, tokenizer = tiny
    prompt = prompt_ids(tokenizer, QUESTIONS)[2]
    want = reference_greedy(model, tokenizer, [prompt], 6, eos_ids(tiny))[0]
    pieces = [tokenizer.decode([t], skip_special_tokens=False) for t in want]
    offsets = [sum(len(p) for p in pieces[:i]) for i in range(len(pieces))]  # 0, len(t0), len(t0) + len(t1), ...
    body = {"prompt": prompt, "max_tokens": 6, "temperature": 0, "logprobs": 0}
    lp = post(served, "/v1/completions", body).json()["choices"][0]["logprobs"]
    assert lp["tokens"] == pieces and lp["text_offset"] == offsets
    assert lp["top_logprobs"] == [{p: v} for p, v in zip(pieces, lp["token_logprobs"])]
    r = post(served, "/v1/completions", {**body, "stream": True})
    chunks = [json.loads(line[6:]) for line in r.text.splitlines() if line.startswith("data: {")]
    streamed = [c["logprobs"] for ch in chunks for c in ch["choices"] if c["logprobs"] is not None]
    assert [p for s in streamed for p in s["tokens"]] == pieces
    assert [o for s in streamed for o in s["text_offset"]] == offsets
    assert [t for s in streamed for t in s["top_logprobs"]] == [{p: v} for s in streamed
                                                                for p, v in zip(s["tokens"], s["token_logprobs"])]


def test_stream_options_without_stream_is_refused(served):
    """vLLM refuses ``stream_options`` unless ``stream`` is true (its ``include_usage`` was ignored)."""
    for route, body in (("/v1/completions", {"prompt": "Hi", "max_tokens": 1}),
                        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1})):
        r = post(served, route, {**body, "stream_options": {"include_usage": True}})
        assert r.status_code == 400 and r.json()["error"]["param"] == "stream_options", r.text
        assert post(served, route, {**body, "stream_options": None}).status_code == 200


TOOL_TEMPLATE = ("{%- for m in messages -%}<{{ m.role }}>{{ m.content or '' }}"
                 "{%- for c in m.tool_calls or [] -%}<call>{{ c.function.arguments | tojson }}</call>{%- endfor -%}"
                 "</{{ m.role }}>{%- endfor -%}")  # renders arguments as Qwen2.5's template does: `| tojson`


def test_chat_messages_reach_the_template_as_vllm_hands_them(tiny):
    """As vLLM's chat parsing: an assistant turn's ``tool_calls`` arguments (OpenAI's JSON text)
    reach the template as a mapping (a ``| tojson`` template wrote the text quoted and escaped), and
    text content parts reach it joined by newlines (a string template raised on the list)."""
    model, tokenizer = tiny
    tokenizer = copy.deepcopy(tokenizer)
    tokenizer.chat_template = TOOL_TEMPLATE
    server, _ = make_server(model, tokenizer)
    try:
        call = {"id": "call_1", "type": "function",
                "function": {"name": "calculator", "arguments": '{"expression": "2+3"}'}}
        messages = [{"role": "user", "content": [{"type": "text", "text": "2+"}, {"type": "text", "text": "3?"}]},
                    {"role": "assistant", "content": None, "tool_calls": [call]},
                    {"role": "tool", "tool_call_id": "call_1", "content": "5"}]
        r = post(server, "/v1/chat/completions", {"messages": messages, "max_tokens": 1, "temperature": 0})
        assert r.status_code == 200, r.text
        text = '<user>2+\n3?</user><assistant><call>{"expression": "2+3"}</call></assistant><tool>5</tool>'
        assert r.json()["prompt_token_ids"] == tokenizer.encode(text, add_special_tokens=False)
        # what cannot reach a text template is refused by name
        for bad, param in (([{"type": "text", "text": "a"}, {"type": "image_url", "image_url": {"url": "x"}}],
                            "messages.0.content.1.type"),
                           ([{"type": "text"}], "messages.0.content.0.text")):
            r = post(server, "/v1/chat/completions", {"messages": [{"role": "user", "content": bad}], "max_tokens": 1})
            assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text
        broken = {**call, "function": {"name": "calculator", "arguments": '{"expression": '}}
        history = [messages[0], {"role": "assistant", "tool_calls": [broken]}]
        r = post(server, "/v1/chat/completions", {"messages": history, "max_tokens": 1})
        assert r.status_code == 400, r.text
        assert r.json()["error"]["param"] == "messages.1.tool_calls.0.function.arguments"
    finally:
        server.engine.stop()
