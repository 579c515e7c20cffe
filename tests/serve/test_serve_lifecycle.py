"""``rlvr serve`` under concurrent lifecycle events: aborts of one request among several running,
weight updates and pauses with requests in flight. Expected tokens come from transformers'
``generate`` on each prompt alone (``reference_greedy``), never from the server under test."""

import asyncio
import copy
import threading
import time

import httpx
import pytest
import torch

from rlvr.serve import build_app
from rlvr.serve.runner import ServeOptions, _Uvicorn
from rlvr.serve.weight_sync import broadcast, open_group
from tests.serve.test_serve import (QUESTIONS, free_port, make_server, perturbed, prompt_ids, reference_greedy, run,
                                    tiny, wait_until)  # noqa: F401 (tiny: the fixture)


def test_aborting_one_of_several_running_requests_leaves_the_others_intact(tiny):
    """Two requests decode side by side; the first (slot 0) is aborted by rid. Its slot is filled by
    moving the other row's keys and values, a write into the KV slab outside the step (it raised
    "Inplace update to inference tensor outside InferenceMode" and left the core's rows and the
    slab's out of step). The abort answers 200, the aborted request ends with finish reason abort,
    and the other goes on to generate()'s greedy tokens on its prompt alone."""
    model, tokenizer = tiny
    server, _ = make_server(model, tokenizer)
    core = server.engine.core
    first, second = prompt_ids(tokenizer, QUESTIONS)[:2]
    body = lambda prompt, rid: {"input_ids": prompt, "rid": rid,  # noqa: E731
                                "sampling_params": {"max_new_tokens": 40, "ignore_eos": True, "temperature": 0}}

    async def go(client):
        a = asyncio.create_task(client.post("/generate", json=body(first, "a")))
        await wait_until(lambda: len(core.running) == 1)
        b = asyncio.create_task(client.post("/generate", json=body(second, "b")))
        await wait_until(lambda: len(core.running) == 2 and len(core.running[1].tokens) >= 2)
        await client.post("/pause_generation", json={"mode": "in_place"})  # both held: the abort meets two rows
        slots = [s.request.id for s in core.running]
        aborted = await client.post("/abort_request", json={"rid": "a"})
        await client.post("/continue_generation", json={})
        return slots, aborted, (await a).json(), (await b).json()

    try:
        slots, aborted, a, b = run(server, go)
    finally:
        server.engine.stop()
    assert slots == ["a", "b"]  # "a" holds slot 0: "b" moves into it
    assert aborted.status_code == 200 and aborted.json() == {"success": True, "aborted": 1}
    assert a["meta_info"]["finish_reason"]["type"] == "abort" and a["meta_info"]["completion_tokens"] < 40
    assert b["output_ids"] == reference_greedy(model, tokenizer, [second], 40, [])[0]
    assert core.running == [] and not core.waiting and server.inflight == {}


@pytest.mark.slow  # 11 s: uvicorn's graceful shutdown runs its course
def test_a_stop_signal_while_a_weight_group_waits_for_its_trainer_ends_the_server(tiny):
    """``/init_weights_update_group`` blocks until every rank joins (up to --request-timeout, here
    60 s); a trainer that never comes leaves it waiting. SIGTERM then ended the server only once that
    wait ran out: the join ran on asyncio's default executor, which ``asyncio.run`` waits for before
    it returns. uvicorn's graceful shutdown gives open requests 10 s (``runner._Uvicorn``); the
    server must be gone well before the 60 s."""
    server, _ = make_server(*tiny, timeout=60.0)
    port = free_port()
    uv = _Uvicorn.make(build_app(server), ServeOptions(port=port), server.engine)
    thread = threading.Thread(target=uv.run, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 30
        while not uv.started:
            assert time.monotonic() < deadline, "uvicorn did not start"
            time.sleep(0.02)
        joining = threading.Thread(target=lambda: httpx.post(
            f"http://127.0.0.1:{port}/init_weights_update_group", timeout=90,
            json={"master_address": "127.0.0.1", "master_port": free_port(), "rank_offset": 1, "world_size": 2,
                  "group_name": "g", "backend": "gloo"}), daemon=True)  # nobody hosts the store
        joining.start()
        time.sleep(1.0)  # the join is under way
        started = time.monotonic()
        uv.handle_exit(15, None)  # what SIGTERM calls
        thread.join(30)
        assert not thread.is_alive(), "the server still runs 30 s after SIGTERM"
        assert time.monotonic() - started < 30
    finally:
        server.engine.stop()


def test_a_paused_engine_stays_paused_through_a_bucketed_distributed_update(tiny):
    """SGLang's partial-rollout flow with the weights sent in two buckets: /pause_generation in
    place, /update_weights_from_distributed with the first half of the tensors, again with the
    rest (naming the version), /continue_generation. As in SGLang (``update_weights_from_distributed``
    on a paused engine updates at once and leaves the pause to the client), the engine stays paused
    between the buckets: the held request decoded nothing under half of the new weights (it resumed
    after the first bucket, then ran to its end before the second came in, its tokens from a model
    half old and half new, and its completion named "default"). It continues under the whole new
    model and says where that version starts, with no entry for the half-way version that made no
    token."""
    model, tokenizer = tiny
    server, _ = make_server(copy.deepcopy(model), tokenizer)
    core = server.engine.core
    new_model = perturbed(model)
    params = list(new_model.named_parameters())
    buckets = [params[:len(params) // 2], params[len(params) // 2:]]
    prompt = prompt_ids(tokenizer, QUESTIONS)[0]
    port = free_port()

    def update(bucket, version=None):
        return {"names": [n for n, _ in bucket], "dtypes": [str(p.dtype) for _, p in bucket],
                "shapes": [list(p.shape) for _, p in bucket], "group_name": "g", "weight_version": version}

    async def go(client):
        joined = asyncio.create_task(client.post("/init_weights_update_group", json={
            "master_address": "127.0.0.1", "master_port": port, "rank_offset": 1, "world_size": 2,
            "group_name": "g", "backend": "gloo"}))
        trainer = await asyncio.to_thread(open_group, "127.0.0.1", port, 0, 2, "g", 30.0, True)
        assert (await joined).status_code == 200
        long = asyncio.create_task(client.post("/generate", json={"input_ids": prompt, "sampling_params": {
            "max_new_tokens": 40, "ignore_eos": True, "temperature": 0}}))
        await wait_until(lambda: len(core.running) == 1 and len(core.running[0].tokens) >= 3)
        await client.post("/pause_generation", json={"mode": "in_place"})
        held = len(core.running[0].tokens)
        statuses = []
        for bucket, version in zip(buckets, (None, "step-2")):
            sent = asyncio.create_task(client.post("/update_weights_from_distributed", json=update(bucket, version)))
            await asyncio.to_thread(lambda: [broadcast(trainer, p.detach().clone()) for _, p in bucket])
            statuses.append((await sent).status_code)
            await asyncio.sleep(0.3)  # tens of decode steps, were the engine running
            assert len(core.running) == 1 and len(core.running[0].tokens) == held, "decoded between the buckets"
        await client.post("/continue_generation", json={})
        out = (await long).json()
        await client.post("/destroy_weights_update_group", json={"group_name": "g"})
        return statuses, held, out

    try:
        statuses, held, out = run(server, go)
    finally:
        server.engine.stop()
    assert statuses == [200, 200]
    ids = out["output_ids"]
    assert len(ids) == 40 and out["meta_info"]["weight_version"] == "step-2"
    # the first token after the pause comes from logits the old weights computed before it
    assert out["meta_info"]["weight_version_starts"] == [[0, "default"], [held + 1, "step-2"]]
    old = held + 1
    # after it, the whole new model's greedy tokens on the cache the old weights wrote (as
    # tests/serve/test_serve.py checks an update from disk): 1e-5 of the largest logit
    with torch.no_grad():
        cache = model(torch.tensor([prompt + ids[:old - 1]]), use_cache=True).past_key_values
        for fed, sampled in zip(ids[old - 1:-1], ids[old:]):
            step = new_model(torch.tensor([[fed]]), past_key_values=cache, use_cache=True)
            cache, logits = step.past_key_values, step.logits[0, -1]
            assert float((logits.max() - logits[sampled]) / logits.abs().max()) < 1e-5
