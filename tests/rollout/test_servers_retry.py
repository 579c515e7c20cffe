"""Rollout servers' faults and lifetimes: where a failed request is retried, what a timed-out
request's abort names, and that a replica's whole process group stops with it. Stand-in servers
(``SGLangStandIn``) record what rlvr sends; expected values come from the protocols' sources."""

import os

import pytest

from rlvr.config.schema import RolloutConfig, RolloutServerConfig
from rlvr.models import load_model, load_tokenizer
from rlvr.rollout.sampling import SamplingParams
from rlvr.rollout.servers import LoadBalancer, Replica, ServerRollout
from tests.rollout.test_servers import SGLangStandIn


@pytest.fixture(scope="module")
def tiny(tiny_model_dir):
    return load_model(tiny_model_dir), load_tokenizer(tiny_model_dir)


class AlwaysHangs(list):
    """A stand-in's call log whose every /generate hangs (a wedged engine that still accepts)."""

    def __init__(self, server, hang_s: float):
        super().__init__()
        self.server, self.hang_s = server, hang_s

    def append(self, item):
        if item[0] == "/generate":
            self.server.hang_s = self.hang_s
        super().append(item)


def test_acquire_avoids_the_replicas_a_request_failed_on_and_moves_its_key():
    replicas = [Replica(0, "a:1"), Replica(1, "b:1"), Replica(2, "c:1")]
    lb = LoadBalancer(replicas)
    assert lb.acquire("k").index == 0  # all idle: the lowest index, pinned
    lb.release(replicas[0])
    assert lb.acquire("k", avoid={0}).index == 1  # failed on 0: the next one, though 0 holds the key
    lb.release(replicas[1])
    assert lb.sticky["k"] == 1 and lb.acquire("k").index == 1  # re-pinned where it succeeded
    lb.release(replicas[1])
    assert lb.acquire("k", avoid={0, 1, 2}).index == 1  # tried everywhere: any replica up, its own first


def test_a_request_that_times_out_is_retried_on_another_replica(tiny):
    """Replica 0 accepts but never answers in time; it stays in the rotation (a timeout is not a
    dead server), yet the retry goes to replica 1: one /generate each, replica 1's tokens, one
    retry counted. It went back to replica 0 (sticky key, lowest index) until max_attempts."""
    model, tokenizer = tiny
    with SGLangStandIn() as bad, SGLangStandIn() as good:
        bad.calls = AlwaysHangs(bad, 1.5)
        config = RolloutConfig(mode="async", name="sglang",
                               external_server_addresses=[f"127.0.0.1:{bad.port}", f"127.0.0.1:{good.port}"],
                               server=RolloutServerConfig(timeout=0.5, retry_delay=0.05, max_attempts=3))
        rollout = ServerRollout(model, tokenizer, config, max_response_length=8)
        try:
            got = rollout.generate([[1, 2, 3]] * 2, SamplingParams(max_new_tokens=8, seed=1), groups=["g", "g"])
        finally:
            rollout.close()
    generates = lambda server: sum(route == "/generate" for route, _ in server.calls)
    assert (generates(bad), generates(good)) == (1, 1)
    assert [c.token_ids for c in got] == [[7, 8], [7, 8]]  # the stand-in's fixed answer
    assert rollout.stats.retries == 1 and rollout.replicas[0].down is None
    assert rollout.balancer.sticky[("group", "g")] == 1


# ---------------------------------------------------------------------- the model the replicas load
OVERRIDE = {"rms_norm_eps": 0.5, "rope_scaling": {"rope_type": "linear", "factor": 2.0}}


def test_replica_commands_carry_the_actors_model_settings(tmp_path):
    """actor_rollout_ref.model.{override_config, tokenizer_path, trust_remote_code} reach every
    replica: rlvr serve as config keys its own CLI reads back, vLLM as --hf-overrides (JSON),
    --tokenizer, --trust-remote-code (vllm/engine/arg_utils.py), SGLang as
    --json-model-override-args, --tokenizer-path, --trust-remote-code (sglang server_args.py)."""
    import json

    from rlvr.cli import build_parser, parse_args
    from rlvr.config import load_config
    from rlvr.config.schema import ModelConfig
    from rlvr.rollout.servers import serve_command, sglang_command, vllm_command

    model_cfg = ModelConfig(path="m", tokenizer_path=str(tmp_path / "tok dir"), trust_remote_code=True,
                            override_config=OVERRIDE)
    cmd = serve_command("m", 8000, RolloutConfig(mode="async"), 512, None, True, model_cfg=model_cfg)
    read = load_config(overrides=parse_args(build_parser(), cmd[3:]).overrides).actor_rollout_ref.model
    assert (read.override_config, read.tokenizer_path, read.trust_remote_code) == (
        OVERRIDE, str(tmp_path / "tok dir"), True)

    def flag(cmd, name):
        return cmd[cmd.index(name) + 1]

    vllm = vllm_command("m", 8000, RolloutConfig(mode="async", name="vllm"), 512, None, False, model_cfg=model_cfg)
    assert json.loads(flag(vllm, "--hf-overrides")) == OVERRIDE and "--trust-remote-code" in vllm
    assert flag(vllm, "--tokenizer") == str(tmp_path / "tok dir")
    sglang = sglang_command("m", 8000, RolloutConfig(mode="async", name="sglang"), 512, None, False,
                            model_cfg=model_cfg)
    assert json.loads(flag(sglang, "--json-model-override-args")) == OVERRIDE and "--trust-remote-code" in sglang
    assert flag(sglang, "--tokenizer-path") == str(tmp_path / "tok dir")
    plain = ModelConfig(path="m")  # nothing set: no flag (the servers' own defaults)
    for build in (vllm_command, sglang_command):
        cmd = build("m", 8000, RolloutConfig(mode="async"), 512, None, False, model_cfg=plain)
        assert not {"--hf-overrides", "--json-model-override-args", "--tokenizer", "--tokenizer-path",
                    "--trust-remote-code"} & set(cmd)


@pytest.mark.slow  # a real rlvr serve replica: 8 s
def test_an_rlvr_serve_replica_computes_with_the_actors_override_and_tokenizer(tiny_model_dir, tmp_path):
    """The policy is loaded with override_config (rms_norm_eps 0.5 changes every log-prob) from a
    folder without tokenizer files (tokenizer_path names another): the replica starts and its greedy
    tokens and log-probs are the in-process engine's on that policy. The replica loaded the bare
    folder before: log-probs of the model without the override, or no start at all without a
    tokenizer."""
    import shutil

    from rlvr.config.schema import ModelConfig
    from rlvr.models.loader import TOKENIZER_FILES
    from rlvr.rollout.engine import NativeRollout

    folder = tmp_path / "model"
    shutil.copytree(tiny_model_dir, folder, ignore=shutil.ignore_patterns(*TOKENIZER_FILES, "tokenizer_config.json",
                                                                          "special_tokens_map.json"))
    policy = load_model(folder, "float32", "cpu", override_config={"rms_norm_eps": 0.5})
    bare = load_model(tiny_model_dir)
    tokenizer = load_tokenizer(tiny_model_dir)
    ids = [tokenizer.encode(q) for q in ["What is 2 + 3?", "Name a colour."]]
    greedy = SamplingParams(max_new_tokens=6, do_sample=False)
    local = NativeRollout(policy, tokenizer, RolloutConfig(), 6).generate(ids, greedy)
    unchanged = NativeRollout(bare, tokenizer, RolloutConfig(), 6).generate(ids, greedy)
    assert abs(local[0].log_probs[0] - unchanged[0].log_probs[0]) > 1e-3  # the override changes the numbers
    model_cfg = ModelConfig(path=str(folder), tokenizer_path=str(tiny_model_dir), override_config={"rms_norm_eps": 0.5})
    config = RolloutConfig(mode="async", max_num_seqs=4, server=RolloutServerConfig(max_start_wait_time=120))
    rollout = ServerRollout(policy, tokenizer, config, max_response_length=6, max_prompt_length=32,
                            log_dir=tmp_path / "logs", model_cfg=model_cfg)
    try:
        remote = rollout.generate(ids, greedy)
    finally:
        rollout.close()
    for a, b in zip(local, remote):
        assert a.token_ids == b.token_ids
        assert max(abs(x - y) for x, y in zip(a.log_probs, b.log_probs)) < 1e-4


# ---------------------------------------------------------------------- what a request leaves to the server
@pytest.mark.parametrize("protocol", ["vllm", "sglang"])
def test_requests_turn_the_servers_penalties_off(protocol, tiny):
    """rlvr samples without penalties. vLLM fills a penalty a request leaves out from the model's
    generation_config.json ("user -> server default", CompletionRequest.to_sampling_params), so
    each is sent neutral: repetition 1.0, presence 0.0, frequency 0.0 (vLLM's and SGLang's
    SamplingParams defaults)."""
    model, tokenizer = tiny
    rollout = ServerRollout(model, tokenizer, RolloutConfig(mode="async", name=protocol), 8,
                            replicas=[Replica(0, "127.0.0.1:30000")])
    _, body = rollout.protocol.request([1, 2], SamplingParams(max_new_tokens=4, seed=7), 2, 4, 11, "r")
    sampling = body.get("sampling_params") or body
    assert {k: sampling.get(k) for k in ("repetition_penalty", "presence_penalty", "frequency_penalty")} == {
        "repetition_penalty": 1.0, "presence_penalty": 0.0, "frequency_penalty": 0.0}


def test_vllm_reads_the_request_with_no_server_default_left(tiny):
    """The body through vLLM's own CompletionRequest, against a model whose generation_config.json
    sets a repetition penalty and sampling defaults (what vllm serve's --generation-config auto
    passes): every sampling value is the request's."""
    from vllm.entrypoints.openai.completion.protocol import CompletionRequest

    model, tokenizer = tiny
    rollout = ServerRollout(model, tokenizer, RolloutConfig(mode="async", name="vllm"), 8,
                            replicas=[Replica(0, "127.0.0.1:30000")])
    params = SamplingParams(max_new_tokens=16, temperature=0.9, top_p=1.0, top_k=-1, min_p=0.0, seed=1)
    _, body = rollout.protocol.request([1, 2, 3], params, 4, 16, 123, "abc")
    server_defaults = {"repetition_penalty": 1.05, "presence_penalty": 0.5, "frequency_penalty": 0.5,
                       "temperature": 0.7, "top_p": 0.8, "top_k": 20, "min_p": 0.1}
    sp = CompletionRequest(**body).to_sampling_params(16, server_defaults)
    assert (sp.repetition_penalty, sp.presence_penalty, sp.frequency_penalty) == (1.0, 0.0, 0.0)
    assert (sp.temperature, sp.top_p, sp.min_p) == (0.9, 1.0, 0.0) and sp.top_k in (-1, 0)  # both are off in vLLM


# ---------------------------------------------------------------------- a replica's processes
def alive(pid: int) -> bool:
    """Running (a zombie nobody reaped yet has exited: its state is Z)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def wait_gone(pid: int, deadline_s: float = 10.0) -> bool:
    import time

    end = time.monotonic() + deadline_s
    while alive(pid) and time.monotonic() < end:
        time.sleep(0.05)
    return not alive(pid)


SERVER_WITH_AN_ENGINE = """
import multiprocessing as mp, signal, sys, time
def engine():
    if sys.argv[2] == "engine-ignores-term":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    time.sleep(120)
if __name__ == "__main__":
    p = mp.Process(target=engine); p.start()
    if sys.argv[1] == "server-ignores-term":  # an API server slow to shut down
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    print("engine", p.pid, flush=True)
    time.sleep(120)
"""


@pytest.mark.parametrize("server, engine", [("server-ignores-term", "engine-exits"),
                                            ("server-exits", "engine-ignores-term")])
def test_stopping_a_replica_stops_the_processes_it_started(server, engine, tmp_path):
    """vLLM's API server runs its engine core in a child process. stop_process signalled the
    server's pid alone: a server that outlived the grace was SIGKILLed and its engine child kept
    running, as did a child that ignored the server's own shutdown. The replica's process group
    (spawn gives it a session of its own) is stopped whole."""
    import signal
    import sys
    import time

    from rlvr.rollout.servers import spawn, stop_process

    script = tmp_path / "server.py"
    script.write_text(SERVER_WITH_AN_ENGINE)
    log = tmp_path / "replica.log"
    process = spawn([sys.executable, str(script), server, engine], log, {})
    end = time.monotonic() + 30
    while "engine" not in log.read_text() and time.monotonic() < end:
        time.sleep(0.05)
    child = int(log.read_text().split()[1])
    try:
        assert alive(child)
        stop_process(process, grace_s=1.0)
        assert process.poll() is not None
        assert wait_gone(child, 5.0), f"the replica's child {child} outlived stop_process"
    finally:
        if alive(child):
            os.kill(child, signal.SIGKILL)
        if process.poll() is None:
            process.kill()


def test_a_replica_stops_when_the_process_that_started_it_is_killed(tmp_path):
    """A trainer killed by SIGKILL (the OOM killer) runs no atexit: its replicas (own sessions)
    kept running, holding their ports and memory. The kernel's parent-death signal stops them."""
    import signal
    import subprocess
    import sys

    trainer = subprocess.Popen([sys.executable, "-c", f"""
import sys, time
from pathlib import Path
from rlvr.rollout.servers import spawn
p = spawn([sys.executable, '-c', 'import time; time.sleep(120)'], Path({str(tmp_path / 'replica.log')!r}), {{}})
print(p.pid, flush=True)
time.sleep(120)
"""], stdout=subprocess.PIPE, text=True)
    try:
        replica = int(trainer.stdout.readline())
        assert alive(replica)
        trainer.send_signal(signal.SIGKILL)
        trainer.wait(10)
        gone = wait_gone(replica, 10.0)
    finally:
        if alive(replica):
            os.kill(replica, signal.SIGKILL)
    assert gone, f"replica {replica} outlived the trainer that started it"


# ---------------------------------------------------------------------- the abort after a timeout
def test_an_abort_names_the_ids_an_sglang_server_holds(tiny):
    """SGLang expands a request of n > 1 samples into rids {rid}_0 .. {rid}_{n-1}
    (io_struct.GenerateReqInput._normalize_rid) and its /abort_request ignores an id it does not
    hold: each is aborted by its own id (the bare rid too: rlvr serve holds the group by it)."""
    model, tokenizer = tiny
    with SGLangStandIn() as sglang:
        config = RolloutConfig(mode="async", name="sglang", external_server_addresses=[f"127.0.0.1:{sglang.port}"],
                               server=RolloutServerConfig(timeout=0.5, retry_delay=0.05))
        rollout = ServerRollout(model, tokenizer, config, max_response_length=8)
        sglang.hang_s = 1.5
        try:
            rollout.generate([[1, 2, 3]] * 3, SamplingParams(max_new_tokens=8, seed=1), groups=["g"] * 3)
        finally:
            rollout.close()
    first = sglang.calls[0][1]
    aborted = {body["rid"] for route, body in sglang.calls if route == "/abort_request"}
    rid = first["rid"]
    assert first["sampling_params"]["n"] == 3
    assert {f"{rid}_0", f"{rid}_1", f"{rid}_2"} <= aborted <= {rid, f"{rid}_0", f"{rid}_1", f"{rid}_2"}


def test_an_abort_names_the_id_vllm_registered_the_completion_by(tiny):
    """vllm serve registers a completion of one prompt as cmpl-{request_id}-0 (its
    completion/serving.py: f"cmpl-{request_id}", then f"{request_id}-{i}" per prompt), and aborts
    by that id (its parallel samples with it: output_processor.abort_requests)."""
    model, tokenizer = tiny
    rollout = ServerRollout(model, tokenizer, RolloutConfig(mode="async", name="vllm"), 8,
                            replicas=[Replica(0, "127.0.0.1:30000")])
    _, body = rollout.protocol.request([1, 2], SamplingParams(max_new_tokens=4, seed=7), 4, 4, 11, "abc")
    assert body["request_id"] == "abc"
    assert rollout.protocol.abort("abc", 4) == [("/abort_requests", {"request_ids": ["cmpl-abc-0"]})]


def test_the_workers_hand_the_model_settings_to_the_server_rollout(monkeypatch):
    """build_rollout (what the hybrid and rollout workers call with actor_rollout_ref.model) hands the
    model settings to ServerRollout: without them the replicas load the bare folder."""
    from types import SimpleNamespace

    from rlvr.config.schema import ModelConfig
    from rlvr.rollout import build_rollout
    from rlvr.rollout import servers

    seen = {}

    class Recorder:
        def __init__(self, *args, model_cfg=None, **kwargs):
            seen["model_cfg"] = model_cfg

    monkeypatch.setattr(servers, "ServerRollout", Recorder)
    model_cfg = ModelConfig(override_config={"rms_norm_eps": 0.5}, trust_remote_code=True)
    config = SimpleNamespace(mode="async", multi_turn=SimpleNamespace(enable=False))
    build_rollout(None, None, config, 8, model_cfg=model_cfg)
    assert seen["model_cfg"] is model_cfg
