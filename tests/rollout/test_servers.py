"""Rollout servers (``rollout.mode=async``): the load balancer, SGLang's request shapes, and two
real ``rlvr serve`` replicas on free loopback ports, started and stopped by their pids.

Expected tokens come from transformers' ``generate`` (``reference_greedy``) or from the
in-process engine, never from the servers under test."""

import copy
import os
import signal
import threading
import time

import pytest
import torch

from rlvr.config import ConfigError, load_config
from rlvr.config.schema import RolloutConfig, RolloutServerConfig
from rlvr.models import load_model, load_tokenizer
from rlvr.rollout.base import end_token_ids
from rlvr.rollout.sampling import SamplingParams
from rlvr.rollout.servers import (LoadBalancer, Replica, ServerRollout, ServersDown, WeightVersionMismatch,
                                  generate_body, parse_generate)
from tests.rollout.test_engine import reference_greedy

QUESTIONS = ["What is 2 + 3?", "Name a colour.", "Tell me a story about a dragon.", "Hi", "Count to five.",
             "Why is the sky blue?"]


def prompt_ids(tokenizer, questions):
    """Plain text, no chat template: the random tiny model mostly repeats a prompt's last token,
    and the template's last token is the same newline for every prompt."""
    return [tokenizer.encode(q) for q in questions]


# ---------------------------------------------------------------------- the balancer
def test_balancer_sends_new_keys_to_the_least_loaded_and_keeps_a_key_on_its_replica():
    replicas = [Replica(0, "a:1"), Replica(1, "b:1"), Replica(2, "c:1")]
    lb = LoadBalancer(replicas)
    first = [lb.acquire(("g", i)).index for i in range(3)]
    assert first == [0, 1, 2]  # 0 in flight everywhere: lowest index, then the next least loaded
    assert lb.acquire(("g", 1)).index == 1  # sticky: its replica, though 1 has the most in flight now
    lb.release(replicas[0])
    assert lb.acquire(("g", 9)).index == 0  # 0 in flight on replica 0 only
    replicas[1].down = "refused"
    assert lb.acquire(("g", 1)).index in (0, 2)  # its replica is down: moved, and stays there
    moved = lb.sticky[("g", 1)]
    assert lb.acquire(("g", 1)).index == moved
    for r in replicas:
        r.down = "gone"
    with pytest.raises(ServersDown, match="every rollout server is down: replica 0 .*gone"):
        lb.acquire()
    small = LoadBalancer([Replica(0, "a:1")], max_keys=2)
    for key in ("x", "y", "x", "z"):  # x used again: y is the oldest when z comes
        small.acquire(key)
    assert list(small.sticky) == ["x", "z"]


# ---------------------------------------------------------------------- SGLang's shapes
def test_generate_body_has_sglangs_field_names():
    """GenerateReqInput: input_ids, sampling_params, return_logprob, rid; greedy is temperature 0."""
    body = generate_body([5, 6], SamplingParams(max_new_tokens=7, do_sample=False, stop=("\n\n",)), 2, 5, 11, "r1",
                         stop_token_ids=[2])
    assert body == {"input_ids": [5, 6], "return_logprob": True, "rid": "r1", "sampling_params": {
        "max_new_tokens": 5, "temperature": 0.0, "top_p": 1.0, "top_k": -1, "min_p": 0.0, "n": 2,
        "sampling_seed": 11, "skip_special_tokens": False, "stop": ["\n\n"], "stop_token_ids": [2],
        "repetition_penalty": 1.0, "presence_penalty": 0.0, "frequency_penalty": 0.0}}  # no penalty, as rlvr samples


def test_generate_answer_is_read_as_sglang_writes_it():
    """One output per sample; output_token_logprobs are [logprob, token id, text] triples."""
    one = {"text": "ab", "output_ids": [3, 4], "meta_info": {
        "id": "r1", "finish_reason": {"type": "stop", "matched": 4}, "weight_version": "7",
        "output_token_logprobs": [[-0.5, 3, None], [-0.25, 4, None]]}}
    [c] = parse_generate(one, 1, Replica(0, "a:1"))
    assert (c.token_ids, c.log_probs, c.finish_reason, c.weight_version, c.matched) == ([3, 4], [-0.5, -0.25],
                                                                                     "stop", 7, 4)
    length = {**one, "meta_info": {**one["meta_info"], "finish_reason": {"type": "length", "length": 2}}}
    assert [c.finish_reason for c in parse_generate([one, length], 2, Replica(0, "a:1"))] == ["stop", "length"]


def test_async_mode_config_is_checked_at_load():
    with pytest.raises(ConfigError, match=r"external_server_addresses\[0\] = 'localhost': write host:port"):
        load_config(overrides=["actor_rollout_ref.rollout.mode=async",
                               "actor_rollout_ref.rollout.external_server_addresses=[localhost]"])
    with pytest.raises(ConfigError, match="mode=sync, which runs no servers"):
        load_config(overrides=["actor_rollout_ref.rollout.external_server_addresses=['127.0.0.1:1']"])
    with pytest.raises(ConfigError, match="name=sglang runs as servers"):
        load_config(overrides=["actor_rollout_ref.rollout.name=sglang"])
    with pytest.raises(ConfigError, match="mode = 'server'"):
        load_config(overrides=["actor_rollout_ref.rollout.mode=server"])
    with pytest.raises(ConfigError, match="weight_sync = 'nccl'"):
        load_config(overrides=["actor_rollout_ref.rollout.mode=async",
                               "actor_rollout_ref.rollout.server.weight_sync=nccl"])
    cfg = load_config(overrides=["actor_rollout_ref.rollout.mode=async", "actor_rollout_ref.rollout.name=sglang",
                                 "actor_rollout_ref.rollout.external_server_addresses=['127.0.0.1:30000']"])
    assert cfg.actor_rollout_ref.rollout.server.max_attempts == 3  # verl's default



GPU_RANKS = ["actor_rollout_ref.rollout.mode=async", "trainer.device=cuda", "trainer.n_gpus_per_node=4",
             "actor_rollout_ref.actor.strategy=fsdp2"]


def test_who_starts_replicas_beside_several_ranks(capsys):
    """Several GPU ranks with the hybrid engine: replicas on the ranks' own GPUs are not built, so
    the engine runs in process, said in a notice (verl's 8-GPU scripts). With hybrid_engine=false
    they are Ray actors on GPUs of their own, tensor_model_parallel_size each for vllm and sglang
    (Ray's CUDA_VISIBLE_DEVICES reaches the server); rlvr serve and external servers take no TP."""
    from rlvr.rollout.servers import launcher_resources

    hybrid = load_config(overrides=GPU_RANKS)
    assert hybrid.actor_rollout_ref.rollout.mode == "sync" and "asleep through each update" in capsys.readouterr().err
    own = load_config(overrides=[*GPU_RANKS, "actor_rollout_ref.hybrid_engine=false", "actor_rollout_ref.rollout.name=vllm",
                                 "actor_rollout_ref.rollout.tensor_model_parallel_size=2",
                                 "actor_rollout_ref.rollout.n_gpus_per_node=2"])
    assert own.actor_rollout_ref.rollout.mode == "async"
    assert launcher_resources(own.actor_rollout_ref.rollout, on_cpu=False)["num_gpus"] == 2
    assert launcher_resources(own.actor_rollout_ref.rollout, on_cpu=True)["num_gpus"] == 0
    with pytest.raises(ConfigError, match="tensor_model_parallel_size = 2: a rollout server over several devices"):
        load_config(overrides=[*GPU_RANKS, "actor_rollout_ref.hybrid_engine=false",
                               "actor_rollout_ref.rollout.tensor_model_parallel_size=2"])  # native
    with pytest.raises(ConfigError, match="tensor_model_parallel_size = 2"):
        load_config(overrides=["actor_rollout_ref.rollout.mode=async", "actor_rollout_ref.rollout.name=vllm",
                               "actor_rollout_ref.rollout.tensor_model_parallel_size=2",
                               "actor_rollout_ref.rollout.external_server_addresses=['127.0.0.1:1']"])

# ---------------------------------------------------------------------- real replicas
@pytest.fixture(scope="module")
def tiny(tiny_model_dir):
    return load_model(tiny_model_dir), load_tokenizer(tiny_model_dir)


@pytest.fixture(scope="module")
def servers(tiny, tmp_path_factory):
    """Two ``rlvr serve`` replicas of the tiny model, started by the rollout."""
    model, tokenizer = tiny
    policy = copy.deepcopy(model)
    config = RolloutConfig(mode="async", n_gpus_per_node=2, max_num_seqs=16,
                           server=RolloutServerConfig(max_start_wait_time=120, retry_delay=0.1))
    rollout = ServerRollout(policy, tokenizer, config, max_response_length=12, max_prompt_length=64,
                            log_dir=tmp_path_factory.mktemp("replicas"))
    yield rollout
    rollout.close()
    for r in rollout.replicas:
        assert r.process.poll() is not None  # stopped by its pid


def greedy(max_new_tokens=12):
    return SamplingParams(max_new_tokens=max_new_tokens, do_sample=False)


def test_greedy_through_two_replicas_equals_generate(servers, tiny):
    model, tokenizer = tiny
    ids = prompt_ids(tokenizer, QUESTIONS)
    expected = reference_greedy(model, tokenizer, ids, 12, end_token_ids(model, tokenizer))
    assert len({tuple(e) for e in expected}) >= 3  # prompts with their own answers: rows cannot be swapped unseen
    served_before = [r.in_flight for r in servers.replicas]
    got = servers.generate(ids, greedy(), groups=[f"u{i}" for i in range(len(ids))])
    assert [c.token_ids for c in got] == expected
    assert served_before == [0, 0] and [r.in_flight for r in servers.replicas] == [0, 0]
    # both replicas served: sticky keys were spread by load
    assert len({servers.balancer.sticky[("group", f"u{i}")] for i in range(len(ids))}) == 2


def perturbed(model, scale=1.0, seed=0):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * scale * p.std().clamp(min=1e-3))


@pytest.mark.parametrize("route", ["distributed", "disk"])
def test_weight_sync_turns_the_replicas_greedy_tokens_into_the_new_policys(servers, tiny, route):
    """After a sync the replicas' greedy tokens are the updated policy's (by transformers'
    generate on it), and every completion carries the version sent."""
    model, tokenizer = tiny
    servers.config.server.weight_sync = route
    perturbed(servers.policy, seed=1 if route == "disk" else 2)  # seeds whose greedy tokens differ
    ids = prompt_ids(tokenizer, QUESTIONS[:4])
    expected = reference_greedy(servers.policy, tokenizer, ids, 12, end_token_ids(model, tokenizer))
    assert expected != reference_greedy(model, tokenizer, ids, 12, end_token_ids(model, tokenizer))
    version = (servers.version or 0) + 1
    servers.sync_weights(version)
    got = servers.generate(ids, greedy())
    assert [c.token_ids for c in got] == expected
    assert {c.weight_version for c in got} == {version}
    servers.sync_weights(version)  # the servers hold it: nothing is sent
    assert servers.stats.weight_syncs == version


def test_a_server_with_other_weights_stops_the_run(servers, tiny):
    model, tokenizer = tiny
    servers.version = (servers.version or 0) + 100  # as if an update had not reached the servers
    try:
        with pytest.raises(WeightVersionMismatch, match=r"replica \d .*generated with weight_version"):
            servers.generate(prompt_ids(tokenizer, QUESTIONS[:1]), greedy())
    finally:
        servers.version -= 100


def test_sampled_rows_of_a_group_do_not_depend_on_the_replica(servers, tiny):
    """A group's seed is the call's seed and its first row: the same call twice gives the same
    samples whichever replica each group lands on."""
    _, tokenizer = tiny
    ids = prompt_ids(tokenizer, QUESTIONS[:3])
    rows = [p for p in ids for _ in range(4)]
    groups = [f"s{i // 4}" for i in range(len(rows))]
    params = SamplingParams(max_new_tokens=8, top_k=8, seed=5)
    first = servers.generate(rows, params, groups=groups)
    servers.balancer.sticky.clear()
    servers.replicas[0].in_flight += 5  # the next call's groups land elsewhere
    try:
        second = servers.generate(rows, params, groups=groups)
    finally:
        servers.replicas[0].in_flight -= 5
    assert [c.token_ids for c in first] == [c.token_ids for c in second]
    assert len({tuple(c.token_ids) for c in first[:4]}) > 1  # n samples of one prompt differ


# ---------------------------------------------------------------------- faults (own replicas)
@pytest.mark.slow  # 16 s on the 2-core machine
def test_a_replica_killed_mid_rollout_loses_no_row(tiny, tmp_path):
    """SIGKILL one of two replicas while its requests run: they are retried on the other, every
    row comes back with the greedy tokens, the retries are counted, the dead one is out."""
    model, tokenizer = tiny
    config = RolloutConfig(mode="async", n_gpus_per_node=2, max_num_seqs=64,
                           server=RolloutServerConfig(max_start_wait_time=120, retry_delay=0.1))
    rollout = ServerRollout(copy.deepcopy(model), tokenizer, config, max_response_length=400, max_prompt_length=64,
                            log_dir=tmp_path)
    try:
        ids = prompt_ids(tokenizer, QUESTIONS) * 4
        expected = reference_greedy(model, tokenizer, ids[:len(QUESTIONS)], 300, end_token_ids(model, tokenizer))
        victim = rollout.replicas[1]

        def kill_when_busy():
            end = time.monotonic() + 60
            while victim.in_flight == 0 and time.monotonic() < end:
                time.sleep(0.01)
            time.sleep(0.3)  # its requests are decoding now
            os.kill(victim.process.pid, signal.SIGKILL)

        killer = threading.Thread(target=kill_when_busy)
        killer.start()
        got = rollout.generate(ids, greedy(300), groups=[f"k{i}" for i in range(len(ids))])
        killer.join()
        assert [c.token_ids for c in got] == expected * 4
        assert rollout.stats.retries >= 1 and victim.down is not None and rollout.replicas[0].down is None
        again = rollout.generate(ids[:2], greedy(300))  # the run goes on with the survivor
        assert [c.token_ids for c in again] == expected[:2]
    finally:
        rollout.close()
    assert all(r.process.poll() is not None for r in rollout.replicas)


def test_external_servers_are_checked_and_never_stopped(servers, tiny):
    """external_server_addresses: rlvr connects to running servers (here the fixture's), checks
    /health, and its close() leaves them running."""
    model, tokenizer = tiny
    addresses = [r.address for r in servers.replicas]
    config = RolloutConfig(mode="async", external_server_addresses=addresses,
                           server=RolloutServerConfig(max_start_wait_time=10))
    client = ServerRollout(servers.policy, tokenizer, config, max_response_length=12)
    assert [r.process for r in client.replicas] == [None, None]
    client.close()
    assert all(r.process.poll() is None for r in servers.replicas)
    bad = RolloutConfig(mode="async", external_server_addresses=["127.0.0.1:9"],
                        server=RolloutServerConfig(max_start_wait_time=1))
    with pytest.raises(RuntimeError, match=r"replica 0 \(127.0.0.1:9\) did not answer /health within 1 s"):
        ServerRollout(servers.policy, tokenizer, bad, max_response_length=12)


def test_a_replica_that_cannot_start_is_named_with_its_log(tiny, tmp_path):
    model, tokenizer = tiny
    broken = copy.deepcopy(model)
    broken.name_or_path = str(tmp_path / "no-such-model")
    config = RolloutConfig(mode="async", server=RolloutServerConfig(max_start_wait_time=60))
    with pytest.raises(RuntimeError, match=r"replica 0 \(127.0.0.1:\d+, log .*replica_0.log\) exited with status"):
        ServerRollout(broken, tokenizer, config, max_response_length=12, log_dir=tmp_path / "logs")


# ---------------------------------------------------------------------- SGLang, by a stand-in
class SGLangStandIn:
    """What rlvr sends to an SGLang server, recorded: SGLang's routes (field names from SGLang's
    ``io_struct.py``), on uvicorn in a thread on a free loopback port. /generate answers fixed
    tokens; the weight group is joined for real (the trainer's broadcast needs a peer), and the
    tensors received are kept."""

    def __init__(self):
        from fastapi import FastAPI, Request

        from rlvr.serve import weight_sync
        from tests.serve.test_serve import Uvicorn

        self.calls: list[tuple[str, dict]] = []
        self.received: dict[str, torch.Tensor] = {}
        self.version = "default"
        self.hang_s = 0.0  # the next /generate answers only after this long (a server that hangs)
        self.garbage: list = []  # the next /generate calls answer 200 with these bodies (a broken server)
        app, groups = FastAPI(), {}

        @app.get("/health")
        async def health():
            return {}

        @app.post("/generate")
        async def generate(request: Request):
            import asyncio

            body = await request.json()
            self.calls.append(("/generate", body))
            hang, self.hang_s = self.hang_s, 0.0
            await asyncio.sleep(hang)
            if self.garbage:
                from fastapi.responses import PlainTextResponse

                bad = self.garbage.pop(0)
                return PlainTextResponse(bad) if isinstance(bad, str) else bad
            n = body["sampling_params"]["n"]
            out = {"text": "x", "output_ids": [7, 8], "meta_info": {
                "id": body["rid"], "finish_reason": {"type": "length", "length": 2}, "prompt_tokens": 3,
                "completion_tokens": 2, "weight_version": self.version,
                "output_token_logprobs": [[-1.0, 7, None], [-2.0, 8, None]]}}
            return out if n == 1 else [out] * n

        @app.post("/abort_request")
        async def abort(request: Request):
            self.calls.append(("/abort_request", await request.json()))
            return {}

        @app.post("/init_weights_update_group")
        async def init_group(request: Request):
            import asyncio

            body = await request.json()
            self.calls.append(("/init_weights_update_group", body))
            groups[body["group_name"]] = await asyncio.to_thread(
                weight_sync.open_group, body["master_address"], body["master_port"], body["rank_offset"],
                body["world_size"], body["group_name"], 30.0)
            return {"success": True, "message": "joined"}

        @app.post("/update_weights_from_distributed")
        async def update_distributed(request: Request):
            import asyncio

            body = await request.json()
            self.calls.append(("/update_weights_from_distributed", body))

            def receive():
                for name, dtype, shape in zip(body["names"], body["dtypes"], body["shapes"]):
                    buffer = torch.empty(shape, dtype=getattr(torch, dtype))
                    weight_sync.broadcast(groups[body["group_name"]], buffer)
                    self.received[name] = buffer

            await asyncio.to_thread(receive)
            self.version = body["weight_version"]
            return {"success": True, "message": "updated"}

        @app.post("/update_weights_from_disk")
        async def update_disk(request: Request):
            from safetensors.torch import load_file

            body = await request.json()
            self.calls.append(("/update_weights_from_disk", body))
            self.received = load_file(f"{body['model_path']}/model.safetensors")
            self.version = body["weight_version"]
            return {"success": True, "message": "loaded", "num_paused_requests": 0}

        self.uvicorn = Uvicorn(app=app)
        self.port = self.uvicorn.port

    def __enter__(self):
        self.uvicorn.__enter__()
        return self

    def __exit__(self, *exc):
        self.uvicorn.__exit__(*exc)


def test_what_rlvr_sends_an_sglang_server(tiny):
    """name=sglang at an external address: the exact payloads of a rollout and of both weight
    routes, and the tensors the server receives are the policy's."""
    model, tokenizer = tiny
    with SGLangStandIn() as sglang:
        config = RolloutConfig(mode="async", name="sglang", external_server_addresses=[f"127.0.0.1:{sglang.port}"])
        rollout = ServerRollout(model, tokenizer, config, max_response_length=8)
        rollout.sync_weights(1)
        got = rollout.generate([[1, 2, 3]] * 2 + [[4, 5]], SamplingParams(max_new_tokens=8, temperature=0.7, seed=3),
                               groups=["a", "a", "b"])
        config.server.weight_sync = "disk"
        rollout.sync_weights(2)
        rollout.close()
    routes = [route for route, _ in sglang.calls]
    assert routes == ["/init_weights_update_group", "/update_weights_from_distributed", "/generate", "/generate",
                      "/update_weights_from_disk"]
    init, update, *gens, disk = [body for _, body in sglang.calls]
    gen_a, gen_b = sorted(gens, key=lambda body: -len(body["input_ids"]))  # sent together: either may arrive first
    assert {k: v for k, v in init.items() if k not in ("master_port", "group_name")} == {
        "master_address": "127.0.0.1", "rank_offset": 1, "world_size": 2, "backend": "gloo"}
    assert isinstance(init["master_port"], int) and update["group_name"] == init["group_name"]
    state = model.state_dict()
    assert update["weight_version"] == "1" and update["flush_cache"] is True
    assert update["names"] == [n for n in state if n != "lm_head.weight"]  # the tied head is the embedding
    assert update["shapes"] == [list(state[n].shape) for n in update["names"]]
    assert set(update["dtypes"]) == {"float32"}
    assert gen_a["sampling_params"] == {"max_new_tokens": 8, "temperature": 0.7, "top_p": 1.0, "top_k": -1,
                                        "min_p": 0.0, "n": 2, "sampling_seed": 3 * 1_000_003 % 2**31,
                                        "skip_special_tokens": False, "repetition_penalty": 1.0,
                                        "presence_penalty": 0.0, "frequency_penalty": 0.0}
    gen_b_seed = (3 * 1_000_003 + 2) % 2**31  # the group's first row is row 2
    assert gen_b["sampling_params"]["n"] == 1 and gen_b["sampling_params"]["sampling_seed"] == gen_b_seed
    assert [gen_a["input_ids"], gen_b["input_ids"]] == [[1, 2, 3], [4, 5]] and gen_a["return_logprob"] is True
    assert [c.token_ids for c in got] == [[7, 8]] * 3 and {c.weight_version for c in got} == {1}
    assert set(disk) == {"model_path", "weight_version", "flush_cache"} and disk["weight_version"] == "2"
    for name, tensor in sglang.received.items():
        assert torch.equal(tensor, state[name]), name


def test_rlvr_serve_replicas_get_the_runs_device_and_step_budget():
    """The ``rlvr serve`` replicas a run starts load on the run's device (a GPU run's replica on the
    GPU, not the CPU: ``rlvr serve`` reads trainer.device) and take rollout.max_num_batched_tokens
    (else rlvr serve's own default, 1024); the command is one rlvr's own CLI parses."""
    from rlvr.cli import build_parser, parse_args
    from rlvr.rollout.servers import serve_command

    def parsed(on_cpu, **kw):
        cmd = serve_command("builtin", 8000, RolloutConfig(mode="async", **kw), 512, None, on_cpu)
        assert cmd[1:3] == ["-m", "rlvr.cli"]
        args = parse_args(build_parser(), cmd[3:])
        return [o for o in args.overrides if o.startswith("trainer.device=")], args.max_num_batched_tokens

    assert parsed(True) == (["trainer.device=cpu"], None)
    assert parsed(False, max_num_batched_tokens=2048) == (["trainer.device=cuda"], 2048)


# ---------------------------------------------------------------------- vllm serve
def test_vllm_serve_on_a_cpu_prefills_whole_prompts_and_gets_seeds(tiny):
    """A CPU replica of vLLM is started with chunked prefill off and a step's budget of at least
    max_model_len (4096 unless asked), so each seeded request's prompt is prefilled whole; a budget
    below max_model_len is refused naming the key. A GPU replica keeps vLLM's chunking. Seeds go to
    the replicas a run starts and from GPU trainers, not to a CPU server of the user's own, which
    may chunk."""
    from rlvr.rollout.servers import vllm_command

    def flags(on_cpu, **kw):
        cmd = vllm_command("m", 8000, RolloutConfig(mode="async", name="vllm", **kw), 512, None, on_cpu)
        budget = cmd[cmd.index("--max-num-batched-tokens") + 1] if "--max-num-batched-tokens" in cmd else None
        return "--no-enable-chunked-prefill" in cmd, budget

    assert flags(True) == (True, "4096")
    assert flags(True, max_num_batched_tokens=8192) == (True, "8192")
    assert flags(False) == (False, None) and flags(False, max_num_batched_tokens=256) == (False, "256")
    with pytest.raises(ValueError, match="max_num_batched_tokens = 256 is less than max_model_len 512"):
        flags(True, max_num_batched_tokens=256)
    model, tokenizer = tiny
    body = lambda rollout: rollout.protocol.request([1, 2], SamplingParams(max_new_tokens=4, seed=7), 2, 4, 11, "r")[1]
    started = ServerRollout(model, tokenizer, RolloutConfig(mode="async", name="vllm"), 8,
                            replicas=[Replica(0, "127.0.0.1:30000")])
    assert body(started)["seed"] == 11
    users = ServerRollout(model, tokenizer, RolloutConfig(mode="async", name="vllm",
                                                          external_server_addresses=["127.0.0.1:30000"]), 8,
                          replicas=[Replica(0, "127.0.0.1:30000")])
    assert "seed" not in body(users)


@pytest.mark.slow
def test_a_vllm_serve_replica_generates_and_takes_new_weights(tiny_vllm_model_dir, tmp_path):
    """name=vllm: one `vllm serve` replica (vLLM's CPU build) started by the rollout on a free
    loopback port: greedy tokens equal transformers' generate, a disk sync (pause, reload_weights
    through /collective_rpc, the version, resume) turns them into the new policy's, and close()
    stops it by its pid. Sampled requests carry their seed and repeat, with more prompt tokens
    in flight than one step's budget (128): vLLM-CPU with chunked prefill would split a prompt
    and fail the seeded request ("CPU Generator does not use offset"), so the replica prefills
    whole prompts."""
    model, tokenizer = load_model(tiny_vllm_model_dir), load_tokenizer(tiny_vllm_model_dir)
    policy = copy.deepcopy(model)
    config = RolloutConfig(mode="async", name="vllm", max_num_seqs=8, max_model_len=128, max_num_batched_tokens=128,
                           server=RolloutServerConfig(max_start_wait_time=300, retry_delay=0.1))
    rollout = ServerRollout(policy, tokenizer, config, max_response_length=12, log_dir=tmp_path)
    try:
        ids = prompt_ids(tokenizer, QUESTIONS)
        eos = end_token_ids(model, tokenizer)
        expected = reference_greedy(model, tokenizer, ids, 12, eos)
        assert len({tuple(e) for e in expected}) >= 3
        got = rollout.generate(ids, greedy(), groups=[f"v{i}" for i in range(len(ids))])
        assert [c.token_ids for c in got] == expected
        # the sampled tokens' log-probs, as vLLM reports them (processed: the distribution sampled from)
        assert all(len(c.log_probs) == len(c.token_ids) and max(c.log_probs) <= 0 for c in got)
        perturbed(policy, seed=1)
        new_expected = reference_greedy(policy, tokenizer, ids, 12, eos)
        assert new_expected != expected
        rollout.sync_weights(1)
        got = rollout.generate(ids, greedy())
        assert [c.token_ids for c in got] == new_expected and {c.weight_version for c in got} == {1}
        samples = rollout.generate(ids[:1] * 4, SamplingParams(max_new_tokens=6, seed=3), groups=["s"] * 4)
        assert len({tuple(c.token_ids) for c in samples}) > 1  # n = 4 samples of one prompt differ
        many = [(ids[i % len(ids)] * 60)[:60 + i] for i in range(16)]  # 16 groups of 2, 60-75 tokens each
        assert min(map(len, many)) == 60 and sum(map(len, many)) > 7 * 128
        draws = [[c.token_ids for c in rollout.generate(many * 2, SamplingParams(max_new_tokens=8, seed=s),
                                                        groups=[f"g{i}" for i in range(16)] * 2)]
                 for s in (5, 5, 6)]
        assert draws[0] == draws[1] != draws[2]  # the seed, not vLLM's own draws, fixes the samples
    finally:
        rollout.close()
    assert rollout.replicas[0].process.poll() is not None


@pytest.fixture
def started(monkeypatch):
    """Replicas rlvr would start are recorded, never started: [(on_cpu, max_model_len)] per start."""
    from rlvr.rollout import servers

    starts = []

    def start(model_path, config, count, log_dir, max_model_len, model_config=None, on_cpu=True, model_cfg=None):
        starts.append((on_cpu, max_model_len))
        return [Replica(i, f"127.0.0.1:{30000 + i}") for i in range(count)]

    monkeypatch.setattr(servers, "start_local_replicas", start)
    return starts


@pytest.mark.parametrize("family, experts", [("qwen3_moe", dict(num_experts=4, num_experts_per_tok=2,
                                                                 moe_intermediate_size=32)),
                                             ("mixtral", dict(num_local_experts=4, num_experts_per_tok=2))])
def test_vllm_serve_replicas_on_a_cpu_refuse_a_mixture_of_experts(family, experts, tokenizer, started):
    """vLLM 0.32's CPU experts kernel reads w13/w2 packed at load; a reload through vllm serve's
    /collective_rpc reload_weights does not pack them again (the in-process engine does it itself,
    _repack_cpu_experts), so CPU replicas would decode every synced version with unpacked experts.
    Refused before any replica starts, naming what to use; a GPU replica's kernel repacks (started)."""
    from rlvr.config import ConfigError
    from tests.rollout.test_vllm import tiny_family

    model = tiny_family(family, **experts)
    config = RolloutConfig(mode="async", name="vllm")
    with pytest.raises(ConfigError, match=r"mixture of experts.*does not pack them again.*rollout.name=native.*"
                                          r"mode=sync with actor_rollout_ref.rollout.name=vllm"):
        ServerRollout(model, tokenizer, config, 8, max_prompt_length=8, device="cpu")
    assert started == []
    ServerRollout(model, tokenizer, config, 8, max_prompt_length=8, device="cuda")
    assert started == [(False, 16)]
    dense = tiny_family("qwen3")
    ServerRollout(dense, tokenizer, config, 8, max_prompt_length=8, device="cpu")
    assert started[-1] == (True, 16)


@pytest.mark.parametrize("family, architecture", [("olmo2", "Olmo2ForCausalLM"), ("smollm3", "SmolLM3ForCausalLM")])
def test_vllm_serve_replicas_refuse_a_family_vllm_runs_through_its_transformers_backend(family, architecture,
                                                                                         tokenizer, started,
                                                                                         monkeypatch):
    """The in-process engine's check (check_native_architecture) holds for the replicas rlvr starts:
    vLLM's greedy tokens differed from transformers' on such families. External servers run the
    model their owner started them with, under a vLLM rlvr does not know: not refused."""
    from rlvr.config import ConfigError
    from rlvr.rollout import servers
    from tests.rollout.test_vllm import tiny_family

    model = tiny_family(family, architectures=[architecture])
    with pytest.raises(ConfigError, match=rf"{architecture} \(model_type '{family}'\).*vllm serve replicas.*"
                                          r"rollout.name=native"):
        ServerRollout(model, tokenizer, RolloutConfig(mode="async", name="vllm"), 8, max_prompt_length=8)
    assert started == []
    monkeypatch.setattr(servers, "wait_healthy", lambda replica, deadline_s: None)
    ServerRollout(model, tokenizer, RolloutConfig(mode="async", name="vllm",
                                                  external_server_addresses=["127.0.0.1:30000"]), 8)
    ServerRollout(model, tokenizer, RolloutConfig(mode="async", name="native"), 8, max_prompt_length=8)  # rlvr serve
    assert len(started) == 1


def synced_names(rollout, monkeypatch) -> set[str]:
    """The tensor names of the folder a disk sync writes (the replicas' load is recorded, not sent)."""
    from safetensors import safe_open

    names = set()

    def load(replica, folder, version, timeout):
        with safe_open(str(folder / "model.safetensors"), "pt") as f:
            names.update(f.keys())

    monkeypatch.setattr(rollout.protocol, "load_from_disk", load)
    rollout.sync_weights(1)
    return names


def test_a_gemma2_disk_sync_to_vllm_serve_leaves_out_the_head_vllm_has_no_parameter_for(tokenizer, monkeypatch):
    """vLLM's Gemma2ForCausalLM computes its logits from embed_tokens and has no lm_head: its reload
    raised "There is no module or parameter named 'lm_head'" on the folder the sync wrote. The folder
    holds the policy's checkpoint names less the tied head; a Llama's (vLLM ties a head of its own)
    keeps it. (In process the same holds, checked on a real engine: test_vllm.py's slow
    test_a_familys_greedy_tokens_equal_transformers_after_the_sync[gemma2].)"""
    from tests.rollout.test_vllm import tiny_family

    gemma = tiny_family("gemma2")
    assert gemma.config.tie_word_embeddings
    rollout = ServerRollout(gemma, tokenizer, RolloutConfig(mode="async", name="vllm"), 8,
                            replicas=[Replica(0, "127.0.0.1:30000")])
    assert synced_names(rollout, monkeypatch) == set(gemma.state_dict()) - {"lm_head.weight"}
    llama = tiny_family("llama", tie_word_embeddings=True)
    rollout = ServerRollout(llama, tokenizer, RolloutConfig(mode="async", name="vllm"), 8,
                            replicas=[Replica(0, "127.0.0.1:30000")])
    assert "lm_head.weight" in synced_names(rollout, monkeypatch)


def test_the_families_vllm_builds_without_a_head_are_vllms():
    """HEADLESS_ARCHITECTURES is read off the installed vLLM: every model file whose logits come from
    embed_tokens, whose causal LM makes no lm_head (Gemma-3's ties one: it is sent the head)."""
    import inspect
    from pathlib import Path

    import vllm.model_executor.models as models
    from vllm.model_executor.models.registry import _VLLM_MODELS

    from rlvr.rollout.vllm_rollout import HEADLESS_ARCHITECTURES

    folder = Path(inspect.getfile(models)).parent
    from_embeddings = {f.stem for f in folder.glob("*.py") if "logits_processor(self.model.embed_tokens" in f.read_text()}
    assert from_embeddings == {_VLLM_MODELS[a][0] for a in HEADLESS_ARCHITECTURES}
    for architecture in HEADLESS_ARCHITECTURES:
        assert "self.lm_head" not in (folder / f"{_VLLM_MODELS[architecture][0]}.py").read_text()
    assert "self.lm_head" in (folder / "gemma3.py").read_text()
    assert "Gemma3ForCausalLM" not in HEADLESS_ARCHITECTURES


def test_vllm_serve_on_a_gpu_takes_a_device_fraction_not_the_cpu_cache_size():
    """A GPU replica gets gpu_memory_utilization 0.5 when the config says none (as the in-process
    engine on a GPU, and as the docs say), never the CPU's KV cache in bytes; a CPU replica gets
    max_num_seqs rows x max_model_len, at most 1 GiB."""
    from rlvr.rollout.servers import vllm_command
    from tests.rollout.test_vllm import tiny_family

    model_config = tiny_family("llama").config

    def memory(on_cpu, **kw):
        cmd = vllm_command("m", 8000, RolloutConfig(mode="async", name="vllm", **kw), 512, model_config, on_cpu)
        return {flag: cmd[cmd.index(flag) + 1] for flag in ("--gpu-memory-utilization", "--kv-cache-memory-bytes")
                if flag in cmd}

    assert memory(False) == {"--gpu-memory-utilization": "0.5"}
    assert memory(False, gpu_memory_utilization=0.8) == {"--gpu-memory-utilization": "0.8"}
    # 2 layers x 1 kv head x 64 x (keys, values) x 4 bytes = 1024 bytes a token, x 1024 rows x 512 tokens
    assert memory(True) == {"--kv-cache-memory-bytes": str(min(1024 * 1024 * 512, 2**30))}


def test_the_drivers_replicas_start_on_the_runs_device(tiny_model_dir, tmp_path, started):
    """The trainer's driver of the servers (RolloutWorker) holds its copy of the policy on the CPU,
    but a GPU run's replicas start on GPUs: they were started with the CPU's settings (on_cpu),
    whatever trainer.device said. Their context is prompt + response."""
    from rlvr.workers.rollout import RolloutWorker

    for device, on_cpu in (("cuda", False), ("cpu", True)):
        config = load_config(overrides=[f"actor_rollout_ref.model.path={tiny_model_dir}", f"trainer.device={device}",
                                        "actor_rollout_ref.rollout.mode=async",
                                        f"trainer.default_local_dir={tmp_path / device}"])
        worker = RolloutWorker(config)
        worker.init_model()
        assert worker.model.device.type == "cpu"
        assert started[-1] == (on_cpu, config.data.max_prompt_length + config.data.max_response_length)


@pytest.mark.parametrize("protocol", ["sglang", "vllm"])
def test_top_k_0_is_sent_as_off(protocol, tiny):
    """top_k 0 is off in rlvr's config (as in vLLM); rlvr serve and SGLang answer 0 with HTTP 400, so
    every server is sent -1."""
    model, tokenizer = tiny
    rollout = ServerRollout(model, tokenizer, RolloutConfig(mode="async", name=protocol), 8,
                            replicas=[Replica(0, "127.0.0.1:30000")])
    for top_k, sent in ((0, -1), (-1, -1), (5, 5)):
        _, body = rollout.protocol.request([1, 2], SamplingParams(max_new_tokens=4, top_k=top_k), 1, 4, 11, "r")
        assert (body.get("sampling_params") or body)["top_k"] == sent


@pytest.mark.parametrize("protocol", ["native", "vllm"])
def test_an_adapter_on_a_tied_embedding_is_refused_on_servers(protocol, tokenizer):
    """A server's model ties its head to the embedding (one tensor); peft adapts the embedding alone,
    so the merged embedding would overwrite the head (vllm serve) or the head would be the adapted
    embedding (rlvr serve, SGLang: the alias is not sent). The in-process engines untie it."""
    from rlvr.config import ConfigError
    from rlvr.models.lora import unwrap
    from tests.rollout.test_vllm import embedding_lora, tiny_family

    tied = tiny_family("llama", tie_word_embeddings=True)
    config = RolloutConfig(mode="async", name=protocol)
    with pytest.raises(ConfigError, match=r"adapter on embed_tokens.*tied.*mode=sync"):
        ServerRollout(unwrap(embedding_lora(tied)), tokenizer, config, 8, replicas=[Replica(0, "127.0.0.1:1")])
    ServerRollout(unwrap(embedding_lora(tied, ("q_proj",))), tokenizer, config, 8, replicas=[Replica(0, "127.0.0.1:1")])
    untied = tiny_family("llama", tie_word_embeddings=False)
    ServerRollout(unwrap(embedding_lora(untied)), tokenizer, config, 8, replicas=[Replica(0, "127.0.0.1:1")])


def test_a_request_to_a_server_that_hangs_times_out_is_aborted_there_and_sent_again(tiny):
    """rollout.server.timeout: the first /generate hangs past it; the client aborts it there by its
    rid, waits retry_delay, sends it again (the replica stays in the rotation) and counts it."""
    model, tokenizer = tiny
    with SGLangStandIn() as sglang:
        config = RolloutConfig(mode="async", name="sglang", external_server_addresses=[f"127.0.0.1:{sglang.port}"],
                               server=RolloutServerConfig(timeout=1.0, retry_delay=0.1))
        rollout = ServerRollout(model, tokenizer, config, max_response_length=8)
        sglang.hang_s = 3.0
        [got] = rollout.generate([[1, 2, 3]], SamplingParams(max_new_tokens=8, do_sample=False))
        rollout.close()
    routes = [route for route, _ in sglang.calls]
    assert routes == ["/generate", "/abort_request", "/generate"], routes
    first, abort, second = [body for _, body in sglang.calls]
    assert abort == {"rid": first["rid"]} and second["rid"] != first["rid"]
    assert got.token_ids == [7, 8] and rollout.stats.retries == 1 and rollout.replicas[0].down is None
    assert rollout.metrics()["rollout/server_retries"] == 1.0 and rollout.metrics()["rollout/server_retries"] == 0.0


def test_a_server_that_answers_200_with_garbage_is_retried_not_a_traceback(tiny):
    """A 200 whose body is not /generate's answer (not JSON; JSON without output_ids; ids of
    another shape) fails that request there, named, and it is sent again: it used to end the run
    with a KeyError or TypeError traceback."""
    model, tokenizer = tiny
    with SGLangStandIn() as sglang:
        config = RolloutConfig(mode="async", name="sglang", external_server_addresses=[f"127.0.0.1:{sglang.port}"],
                               server=RolloutServerConfig(retry_delay=0.01, max_attempts=4))
        rollout = ServerRollout(model, tokenizer, config, max_response_length=8)
        sglang.garbage = ["<html>oops</html>", {"text": "x"}, {"output_ids": 5, "meta_info": {}}]
        [got] = rollout.generate([[1, 2, 3]], SamplingParams(max_new_tokens=8, do_sample=False))
        sglang.garbage = [{"text": "x"}] * 2
        config.server.max_attempts = 2
        with pytest.raises(ServersDown, match=r"HTTP 200 on /generate with a body that is not its answer \(KeyError"):
            rollout.generate([[1, 2, 3]], SamplingParams(max_new_tokens=8, do_sample=False))
        rollout.close()
    assert got.token_ids == [7, 8] and rollout.stats.retries >= 3 and rollout.replicas[0].down is None


def test_servers_on_other_machines_get_the_weights_by_disk(tiny):
    """auto: a broadcast is hosted on the loopback, so servers elsewhere read a folder; naming
    the broadcast for them is refused with the fix (nothing is contacted: the replicas are given)."""
    model, tokenizer = tiny
    remote = [Replica(0, "10.0.0.5:30000")]
    rollout = ServerRollout(model, tokenizer, RolloutConfig(mode="async", name="sglang"), 8, replicas=remote)
    assert rollout.route == "disk"
    local = ServerRollout(model, tokenizer, RolloutConfig(mode="async", name="sglang"), 8,
                          replicas=[Replica(0, "127.0.0.1:30000")])
    assert local.route == "distributed"
    real = local.policy  # a GPU policy (a stand-in's parameters: no CUDA here): SGLang on a GPU groups
    local.policy = type("OnGPU", (), {"parameters": lambda self: iter([type("P", (), {"is_cuda": True})()])})()
    assert local.route == "disk"  # by NCCL, which rlvr's client does not open
    local.policy = real
    rollout.config.server.weight_sync = "distributed"
    with pytest.raises(RuntimeError, match="weight_sync=distributed reaches servers on this machine only.*"
                                           "weight_sync=disk with rollout.server.weights_dir"):
        rollout.sync_weights(1)


def test_an_external_server_with_an_api_key_gets_it_on_every_request(tiny, tmp_path):
    """rollout.server.api_key: every route rlvr calls (health, generate, the disk weight update)
    carries Authorization: Bearer KEY, so a server started with --api-key serves the rollout and
    takes the weights; without the key the health check stops at once, saying which key to set."""
    from tests.serve.test_serve import Uvicorn, make_server

    model, tokenizer = tiny
    server, _ = make_server(copy.deepcopy(model), tokenizer, path=str(tmp_path), api_key="sekret")
    try:
        with Uvicorn(server) as url:
            address = url.removeprefix("http://")
            config = RolloutConfig(mode="async", external_server_addresses=[address],
                                   server=RolloutServerConfig(max_start_wait_time=30, api_key="sekret",
                                                              weight_sync="disk"))
            client = ServerRollout(copy.deepcopy(model), tokenizer, config, max_response_length=8)
            ids = prompt_ids(tokenizer, QUESTIONS[:2])
            got = client.generate(ids, greedy(8))
            assert [c.token_ids for c in got] == reference_greedy(model, tokenizer, ids, 8, end_token_ids(model, tokenizer))
            client.sync_weights(7)
            assert client.generate(ids[:1], greedy(8))[0].weight_version == 7
            client.close()
            keyless = RolloutConfig(mode="async", external_server_addresses=[address],
                                    server=RolloutServerConfig(max_start_wait_time=30))
            started = time.monotonic()
            with pytest.raises(RuntimeError, match=r"wants an API key \(HTTP 401 on /health\): set "
                                                   r"actor_rollout_ref.rollout.server.api_key"):
                ServerRollout(copy.deepcopy(model), tokenizer, keyless, max_response_length=8)
            assert time.monotonic() - started < 10  # not the 30 s deadline
    finally:
        server.engine.stop()


def test_a_replica_gone_before_a_weight_update_leaves_the_rotation(tiny, tmp_path):
    """A replica killed between two rollouts is found by the next weight update (disk route): it
    leaves the rotation, the survivor takes the version and serves the next rollout. Before the
    fix the update's ConnectError ended the run."""
    model, tokenizer = tiny
    config = RolloutConfig(mode="async", n_gpus_per_node=2,
                           server=RolloutServerConfig(max_start_wait_time=120, retry_delay=0.1, weight_sync="disk"))
    rollout = ServerRollout(copy.deepcopy(model), tokenizer, config, max_response_length=8, max_prompt_length=64,
                            log_dir=tmp_path)
    try:
        victim = rollout.replicas[1]
        os.kill(victim.process.pid, signal.SIGKILL)
        victim.process.wait(10)
        rollout.sync_weights(3)
        assert victim.down is not None and "ConnectError while loading version 3" in victim.down
        got = rollout.generate(prompt_ids(tokenizer, QUESTIONS[:2]), greedy(8), groups=["a", "b"])
        assert {c.weight_version for c in got} == {3}
        os.kill(rollout.replicas[0].process.pid, signal.SIGKILL)
        rollout.replicas[0].process.wait(10)
        with pytest.raises(ServersDown, match=r"(?s)replica 0 .*ConnectError while loading version 4.*replica 1"):
            rollout.sync_weights(4)
    finally:
        rollout.close()


@pytest.mark.slow  # two rlvr serve processes and a kill: about 20 s
def test_a_weight_group_a_replica_left_is_destroyed_on_both_sides(tiny, tmp_path):
    """The broadcast's group is opened again without a replica that left; the old group is
    destroyed on the survivors (SGLang's /destroy_weights_update_group: asking again answers that it
    is not open) and shut down on the trainer's side, not left holding its connections."""
    model, tokenizer = tiny
    config = RolloutConfig(mode="async", n_gpus_per_node=2, external_server_addresses=[],
                           server=RolloutServerConfig(max_start_wait_time=120, retry_delay=0.1,
                                                      weight_sync="distributed"))
    rollout = ServerRollout(copy.deepcopy(model), tokenizer, config, max_response_length=8, max_prompt_length=64,
                            log_dir=tmp_path)
    try:
        rollout.sync_weights(1)
        first = rollout._group
        victim, survivor = rollout.replicas[1], rollout.replicas[0]
        os.kill(victim.process.pid, signal.SIGKILL)
        victim.process.wait(10)
        rollout.sync_weights(2)
        assert victim.down is not None and rollout._group is not first and rollout._group_members == [0]
        again = survivor.post("/destroy_weights_update_group", json={"group_name": first.name}, timeout=10)
        assert again.status_code == 400 and "is not open" in again.text
        got = rollout.generate(prompt_ids(tokenizer, QUESTIONS[:1]), greedy(8), groups=["a"])
        assert {c.weight_version for c in got} == {2}
    finally:
        rollout.close()
    assert rollout._group is None  # close left the group too
