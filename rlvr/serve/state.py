"""What every route shares: the engine, the tokenizer, the limits, and a request's path through them.

``Server.complete(http_request, rows)`` submits a request's rows (one per sample, ``n`` of them)
and returns their completions. It aborts the rows (and frees their KV rows) when the client
disconnects, when the request runs past ``--request-timeout``, or when one of them is refused by a
full queue (503). Prompt checks (context length, vocabulary, ``max_tokens``) happen before the
engine sees anything; weight updates go through the engine's pause/load/resume.
"""

from __future__ import annotations

import asyncio
import random
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from rlvr.rollout.async_engine import AsyncEngine, EngineBusy
from rlvr.rollout.base import Completion
from rlvr.rollout.core import Request
from rlvr.rollout.sampling import SamplingParams
from rlvr.serve.protocol import BadRequest

MAX_N = 256
"""Samples one request may ask for (``n``); more is refused (a GRPO group is 4-64)."""


class ClientGone(Exception):
    """The client closed the connection: its rows were aborted."""


@dataclass
class RowSpec:
    """A request's sampling, resolved from any route's field names."""

    prompt_ids: list[int]
    max_new_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    min_p: float = 0.0
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    n: int = 1
    seed: int | None = None


@dataclass
class Server:
    """The engine behind the routes. ``load_weights(folder)`` copies a saved model's tensors into
    the served model (the engine is paused while it runs); ``release()``/``reacquire()`` give back
    and take again what generation holds besides the weights."""

    engine: AsyncEngine
    tokenizer: Any
    model_name: str
    model_path: str
    max_model_len: int
    vocab_size: int
    request_timeout: float = 600.0
    api_key: str | None = None
    tool_parser: str = "hermes"
    load_weights: Callable[[str], str] | None = None
    release: Callable[[set[str]], str] | None = None
    model: Any = None
    """The served model (the distributed weight update copies into it)."""
    render_chat: Callable[[Any, list[int]], list[int]] | None = None
    """A chat request's prompt ids from its template's (the training gateway puts the tokens the model
    sampled in place of its earlier turns' re-rendered text, ``rlvr/agents/gateway.py``)."""
    groups: dict[str, Any] = field(default_factory=dict)
    """Weight-update process groups by name (``weight_sync.py``)."""
    weight_version: str = "default"
    released: set[str] = field(default_factory=set)
    inflight: dict[str, list[str]] = field(default_factory=dict)
    """A client's request id -> the engine ids of its rows (``/abort_request`` by ``rid``)."""
    versions: dict[int, str] = field(default_factory=lambda: {0: "default"})
    """The engine's version numbers -> the names clients gave them (SGLang's are strings)."""
    aborted: int = 0

    # ------------------------------------------------------------------ prompts
    def check_prompt(self, ids: Sequence[int], field_name: str) -> list[int]:
        if not ids:
            raise BadRequest(field_name, "the prompt has no tokens")
        bad = next((t for t in ids if not isinstance(t, int) or t < 0 or t >= self.vocab_size), None)
        if bad is not None:
            raise BadRequest(field_name, f"token id {bad} is outside the vocabulary [0, {self.vocab_size})")
        if len(ids) >= self.max_model_len:
            raise BadRequest(field_name, f"the prompt has {len(ids)} tokens; this server's context (--max-model-len) "
                                         f"is {self.max_model_len}, which must leave room for one new token")
        return list(ids)

    def budget(self, prompt_len: int, max_tokens: int | None, field_name: str) -> int:
        """New tokens for a prompt: ``max_tokens`` (at least 1, within the context), or what the
        context leaves when None."""
        room = self.max_model_len - prompt_len
        if max_tokens is None:
            return room
        if max_tokens < 1:
            raise BadRequest(field_name, f"must be at least 1, got {max_tokens}")
        if max_tokens > room:
            raise BadRequest(field_name, f"{max_tokens} new tokens after a {prompt_len}-token prompt exceed the "
                                         f"context (--max-model-len {self.max_model_len}); ask for at most {room}")
        return max_tokens

    def check_token_ids(self, ids: Sequence[int] | None, field_name: str) -> tuple[int, ...]:
        ids = tuple(ids or ())
        bad = next((t for t in ids if t < 0 or t >= self.vocab_size), None)
        if bad is not None:
            raise BadRequest(field_name, f"token id {bad} is outside the vocabulary [0, {self.vocab_size})")
        return ids

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=True)

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=skip_special_tokens)

    # ------------------------------------------------------------------ generation
    def requests(self, spec: RowSpec, rid: str | None) -> tuple[str, list[Request]]:
        """The engine requests of ``spec``: ``n`` rows that share one prefill (one group) and draw
        rows 0..n-1 of the uniforms of one seed (a seed not given is drawn at random)."""
        if self.released:
            raise BadRequest("server", f"memory released ({', '.join(sorted(self.released))}); "
                                       "POST /resume_memory_occupation first", status=503)
        rid = rid or uuid.uuid4().hex
        if rid in self.inflight:
            raise BadRequest("rid", f"a request with id {rid!r} is running; ids must be unique")
        seed = spec.seed if spec.seed is not None else random.SystemRandom().randrange(2**31)
        params = SamplingParams(max_new_tokens=spec.max_new_tokens, do_sample=spec.temperature > 0,
                                temperature=spec.temperature if spec.temperature > 0 else 1.0, top_p=spec.top_p,
                                top_k=spec.top_k, min_p=spec.min_p, stop=spec.stop, seed=seed)
        ids = [rid] if spec.n == 1 else [f"{rid}/{j}" for j in range(spec.n)]
        group = ("serve", rid, uuid.uuid4().hex)  # this request's rows only: never another client's prompt
        return rid, [Request(i, spec.prompt_ids, params, group=group, row=j, width=spec.n,
                             stop_token_ids=spec.stop_token_ids, ignore_eos=spec.ignore_eos)
                     for j, i in enumerate(ids)]

    def check_room(self, rows: int) -> None:
        """503 now when ``rows`` more would overflow the queue (a stream must refuse before its
        200 starts; the engine checks again at each add)."""
        waiting = len(self.engine.core.waiting)
        if waiting + rows > self.engine.max_waiting:
            raise BadRequest("server", f"the queue is full ({waiting} requests are waiting, at most "
                                       f"{self.engine.max_waiting}); retry later", status=503)

    def tasks(self, rid: str, rows: list[Request],
              on_tokens: Callable[[int, list[int], list[float]], None] | None = None) -> list[asyncio.Task]:
        """One task per row (cancelling one aborts its row); ``rid`` is listed as in flight until
        every row has ended. A second request of the id that got past ``requests``' check (both were
        checked before either started) is refused here, where checking and listing take no await."""
        if rid in self.inflight:
            raise BadRequest("rid", f"a request with id {rid!r} is running; ids must be unique")
        self.inflight[rid] = [r.id for r in rows]
        tasks = [asyncio.create_task(self.engine.generate(
            r, None if on_tokens is None else (lambda ids, lps, j=j: on_tokens(j, ids, lps)))) for j, r in enumerate(rows)]
        remaining = [len(tasks)]

        def ended(_task) -> None:
            remaining[0] -= 1
            if remaining[0] == 0:
                self.inflight.pop(rid, None)

        for task in tasks:
            task.add_done_callback(ended)
        return tasks

    async def complete(self, http_request, rid: str, rows: list[Request]) -> list[Completion]:
        """Every row's completion, or: 503 (queue full), 504 (past ``request_timeout``),
        ``ClientGone`` (the client left); in each case every row is aborted first."""
        tasks = self.tasks(rid, rows)
        everything = asyncio.gather(*tasks)
        watcher = asyncio.create_task(wait_for_disconnect(http_request)) if http_request is not None else None
        try:
            waiting = {everything} | ({watcher} if watcher is not None else set())
            done, _ = await asyncio.wait(waiting, timeout=self.request_timeout, return_when=asyncio.FIRST_COMPLETED)
            if everything in done:
                try:
                    return everything.result()
                except EngineBusy as err:
                    raise BadRequest("server", f"the queue is full ({err}); retry later", status=503) from None
            self.aborted += len(rows)
            if watcher is not None and watcher in done:
                raise ClientGone(rid)
            raise BadRequest("request", f"ran past --request-timeout {self.request_timeout:g} s; its rows were "
                                        "aborted", status=504)
        finally:
            for task in tasks:
                task.cancel()  # a finished one ignores it; a running one aborts its row
            if watcher is not None:
                watcher.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    def version_name(self, completion: Completion) -> str:
        return self.versions.get(completion.weight_version, str(completion.weight_version))

    # ------------------------------------------------------------------ weights
    async def update_weights_from_disk(self, model_path: str, weight_version: str | None, abort_all: bool,
                                       flush_cache: bool, keep_pause: bool) -> tuple[bool, str, int]:
        if self.load_weights is None:
            return False, "this server cannot load weights", 0
        return await self.update_weights(lambda: self.load_weights(model_path), weight_version, abort_all,
                                         flush_cache, keep_pause)

    async def update_weights(self, load: Callable[[], str], weight_version: str | None, abort_all: bool,
                             flush_cache: bool, keep_pause: bool) -> tuple[bool, str, int]:
        """Pause (running rows finish, or end with ``abort_all``; rows a ``/pause_generation`` holds in
        place stay held, and go on under the new weights), ``load()`` on the engine thread, name the
        version, resume -> (success, message, requests aborted)."""
        core = self.engine.core
        aborted = len(core.running) + len(core.waiting) if abort_all else 0
        held = await self.engine.call(lambda: bool(core.running) and not core.stepping)
        try:
            await self.engine.pause("abort" if abort_all else "in_place" if held else "wait",
                                    deadline_s=self.request_timeout)
            number = max(self.versions) + 1
            holder: list[str] = []
            await self.engine.update_weights(lambda: holder.append(load()), number)
            self.versions[number] = weight_version if weight_version is not None else self.weight_version
            self.weight_version = self.versions[number]
            message = holder[0] if holder else ""
            if flush_cache and not await self.engine.call(self.flush):
                message += "; the KV slab is kept: requests are running or waiting"
            return True, f"{message}; weight_version {self.weight_version!r}", aborted
        except (ValueError, OSError, RuntimeError, TimeoutError) as err:  # a refused folder changed nothing; say why
            return False, f"weights not updated: {err}", aborted
        finally:
            if not keep_pause:
                await self.engine.resume()

    def flush(self) -> bool:
        """Drop kept contexts and the KV slab (engine thread; only when nothing runs)."""
        core = self.engine.core
        if core.running or core.waiting:
            return False
        core.kept = []
        core.release()
        return True


async def wait_for_disconnect(http_request) -> None:
    """Return when the client has gone (the body was read already: the next ASGI message a
    server sends is ``http.disconnect``, when the client closes the connection)."""
    while True:
        message = await http_request.receive()
        if message["type"] == "http.disconnect":
            return


def copy_weights_into(model: torch.nn.Module, folder: Path) -> str:
    """Copy the tensors of the saved model in ``folder`` into ``model`` in place -> what was copied.
    Every name and shape is checked before the first copy, so a refused folder changes nothing."""
    from rlvr.models.loader import ModelLoadError, read_weights

    if not folder.is_dir():
        raise ValueError(f"{folder}: not a folder (give a Hugging Face folder of *.safetensors)")
    if (folder / "adapter_config.json").is_file():
        raise ValueError(f"{folder} is a LoRA adapter; `rlvr export` merges it into a whole model first")
    try:
        weights = read_weights(folder)
    except ModelLoadError as err:
        raise ValueError(str(err)) from None
    state = model.state_dict()
    unknown = sorted(set(weights) - set(state))
    if unknown:
        raise ValueError(f"{folder}: {len(unknown)} tensors the served model does not have, e.g. {unknown[:3]}")
    for name, tensor in weights.items():
        if tuple(tensor.shape) != tuple(state[name].shape):
            raise ValueError(f"{folder}: {name} has shape {tuple(tensor.shape)}, the served model's "
                             f"{tuple(state[name].shape)}")
    loaded = {state[name].data_ptr() for name in weights}
    missing = sorted(n for n in set(state) - set(weights) if state[n].data_ptr() not in loaded)  # tied: loaded
    if missing:
        raise ValueError(f"{folder} lacks {len(missing)} of the served model's tensors, e.g. {missing[:3]}")
    with torch.no_grad():
        for name, tensor in weights.items():
            state[name].copy_(tensor.to(state[name].dtype))
    return f"{len(weights)} tensors from {folder}"
