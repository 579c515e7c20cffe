"""The OpenAI gateway: train an agent of the user's, which calls an OpenAI-compatible endpoint, on
exactly the tokens the model sampled.

``openai_agent`` is an agent loop (``loop.py``) that runs the user's code once per episode:

- ``rollout.agent.gateway.function`` (``file.py:name`` or ``module:name``): ``async def
  agent(base_url, api_key, row) -> reward``, called in the rollout's event loop;
- ``rollout.agent.gateway.command``: a process started per episode with ``OPENAI_BASE_URL`` and
  ``OPENAI_API_KEY`` set and the row (JSON) on stdin; its stdout's last line is the reward.

A reward of ``None`` leaves the episode to the reward function of its ``data_source``.

Its calls reach the engine through ``rlvr serve``'s own OpenAI routes (``/v1/chat/completions``,
``/v1/completions``: the chat template, tool-call parsing, streaming), served on a free loopback
port for the rollout. Each episode has a key of its own (``Authorization: Bearer KEY``); a call
with another key, or after its episode ended, gets 401. Each call's prompt token ids and sampled
token ids, log-probs and weight version are recorded, and the episode is assembled from them
without re-tokenising anything: a call whose prompt extends the previous call's prompt and
completion continues the sample (the model's tokens mask 1, what the agent or the template added
between them mask 0).

Where the calls stop extending each other (the agent rewrote its context, or the chat template
rendered the model's earlier turn to other tokens), the episode splits: each chain of calls that
extend each other is a sample of its own, and the samples share the episode's reward and advantage
(``AgentLoopOutput.split_samples``; counted as ``agent/context_breaks`` and ``agent/split_samples``).
This is AReaL's "concat" export on a chain: every sampled token is trained once, in the context it
was sampled in, and nothing is re-tokenised; the alternative, a sample per call (AReaL's
"individual" style), trains the same tokens with the context repeated as many times as there are calls.

The rollout's sampling settings (temperature, top-p, top-k) apply to every call whatever the agent
asks, since the update computes the sampled tokens' log-probs under them; an agent's
``max_tokens`` caps its call. An episode fails (its reward NaN: counted, its group left out, as a
reward function's NaN) when the agent raises, runs past ``gateway.timeout``, makes more than
``gateway.max_calls`` calls, or returns something that is not a number or None.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import dataclasses
import json
import math
import numbers
import os
import secrets
import signal
import sys
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from rlvr.agents.loop import AgentLoopBase, AgentLoopOutput, register
from rlvr.rollout.base import Completion

_episode: contextvars.ContextVar["Episode"] = contextvars.ContextVar("agent_episode")


@dataclass
class Episode:
    row: int
    key: str
    calls: list[tuple[list[int], Any]] = field(default_factory=list)  # (prompt ids, TokenOutput)
    open: bool = True
    failed: str | None = None
    messages: list | None = None  # the chat call being answered: its messages
    last: tuple | None = None  # the last chat call: (messages, prompt ids, sampled ids, their text)


class GatewayEngine:
    """What ``rlvr serve``'s routes call as their engine: each request goes to the rollout's round
    server as a call of the episode whose key it carries."""

    def __init__(self, rounds, params, max_calls: int, decode):
        self.rounds, self.params, self.max_calls, self.decode = rounds, params, max_calls, decode
        self.core = SimpleNamespace(waiting=(), eos_ids=())  # the routes' queue check: the rounds have no bound
        self.max_waiting = sys.maxsize

    async def generate(self, request, on_tokens=None) -> Completion:
        from rlvr.agents.rollout import _row
        from rlvr.serve.protocol import BadRequest

        episode = _episode.get()
        if len(episode.calls) >= self.max_calls:
            episode.failed = f"more than actor_rollout_ref.rollout.agent.gateway.max_calls={self.max_calls} calls"
            raise BadRequest("request", episode.failed, status=429)
        if request.stop_token_ids:
            raise BadRequest("stop_token_ids", "not taken while training: the rollout's end tokens apply")
        if request.ignore_eos:  # the rollout ends a call at its end tokens, as the trained policy does
            raise BadRequest("ignore_eos", "not taken while training: the rollout's end tokens apply")
        _row.set(episode.row)
        params = dataclasses.replace(self.params, max_new_tokens=min(request.params.max_new_tokens,
                                                                     self.params.max_new_tokens),
                                     stop=tuple(request.params.stop))
        out = await self.rounds.generate(request.id, prompt_ids=request.prompt_ids, sampling_params=params)
        matched = self.matched_stop(out, params.stop)
        episode.calls.append((list(request.prompt_ids), out))
        if episode.messages is not None:  # a chat call: the text it answered (cut before its stop string, as the routes cut it)
            text = self.decode(out.token_ids)
            episode.last = (episode.messages, list(request.prompt_ids), list(out.token_ids),
                            text[:text.index(matched)] if matched is not None else text)
        else:
            episode.last = None
        episode.messages = None
        if on_tokens is not None:  # a streamed call: its tokens in one event
            on_tokens(out.token_ids, out.log_probs)
        return Completion(out.token_ids, out.log_probs, out.finish_reason, out.weight_version, matched=matched)

    def matched_stop(self, out, stops) -> str | None:
        """The stop string that ended a call (the routes cut its text there and name it in
        ``stop_reason``, as vLLM does): the first of the request's list in its text, as the engine
        checks them; None when it ended on an end token or its length."""
        if out.finish_reason != "stop" or not stops:
            return None
        text = self.decode(out.token_ids)
        return next((s for s in stops if s in text), None)


class Gateway:
    """``rlvr serve``'s app over ``GatewayEngine`` on a free loopback port, for one rollout."""

    def __init__(self, rounds, params, tokenizer, config, max_model_len: int):
        self.config = config.actor_rollout_ref.rollout.agent.gateway
        self.tokenizer, self.max_model_len = tokenizer, max_model_len
        self.engine = GatewayEngine(rounds, params, self.config.max_calls,
                                    lambda ids: tokenizer.decode(ids, skip_special_tokens=True))
        self.episodes: dict[str, Episode] = {}
        self.breaks = 0
        self.agent = load_agent_function(self.config.function) if self.config.function else None  # once a rollout

    def episode(self, row: int) -> Episode:
        episode = Episode(row, secrets.token_hex(16))
        self.episodes[episode.key] = episode
        return episode

    async def __aenter__(self) -> "Gateway":
        import uvicorn
        from fastapi import Request

        from rlvr.distributed.worker import free_port
        from rlvr.serve.app import build_app, error_response
        from rlvr.serve.state import Server

        vocab = len(self.tokenizer)
        server = Server(self.engine, self.tokenizer, "rlvr-policy", "rlvr-policy", self.max_model_len, vocab,
                        request_timeout=self.config.timeout, tool_parser=self.config.tool_call_parser,
                        render_chat=self.render_chat)
        app = build_app(server)

        @app.middleware("http")
        async def episode_key(request: Request, call_next):  # runs before the handler: its episode is set there
            given = request.headers.get("authorization", "").removeprefix("Bearer ").strip()
            episode = self.episodes.get(given)
            if episode is None or not episode.open:
                return error_response(401, "unknown or ended episode key: send the key your episode was given "
                                           "(OPENAI_API_KEY) as Authorization: Bearer KEY")
            _episode.set(episode)
            return await call_next(request)

        self.port = free_port()
        self.uv = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="error",
                                                lifespan="off"))
        self.task = asyncio.ensure_future(self.uv.serve())
        while not self.uv.started:
            if self.task.done():
                self.task.result()
            await asyncio.sleep(0.01)
        return self

    async def __aexit__(self, *exc) -> None:
        self.uv.should_exit = True
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.task, 10)

    def render_chat(self, body, template_ids: list[int]) -> list[int]:
        """The prompt of a chat call that continues the episode's last one (its messages, then the
        assistant turn it was answered with, then new ones): the last prompt's ids, the tokens the
        model sampled, the template's glue after them (an end marker's newline), then the new
        messages as the template renders them. Anything else keeps the template's ids (a context
        break when it does not extend the last call: counted by ``assemble``)."""
        episode = _episode.get()
        episode.messages = [dict(m) for m in body.messages]
        if episode.last is None:
            return template_ids
        before_msgs, before_ids, sampled, text = episode.last
        n, messages = len(before_msgs), episode.messages
        turn_msg = messages[n] if len(messages) > n else None
        if messages[:n] != before_msgs or turn_msg is None or turn_msg.get("role") != "assistant" \
                or not answered_as(turn_msg, text):
            return template_ids
        tools = body.tools if body.tool_choice != "none" else None

        def render(msgs, generation_prompt):
            return self.tokenizer.encode(self.tokenizer.apply_chat_template(
                msgs, tools=tools, add_generation_prompt=generation_prompt, tokenize=False,
                **(body.chat_template_kwargs or {})), add_special_tokens=False)

        with_turn = render(messages[:n + 1], False)
        if render(before_msgs, True) != before_ids or template_ids[:len(with_turn)] != with_turn \
                or with_turn[:len(before_ids)] != before_ids:
            return template_ids
        turn = with_turn[len(before_ids):]  # the template's text of the turn: content, end marker, glue
        return before_ids + sampled + turn_glue(turn, sampled, self.tokenizer) + template_ids[len(with_turn):]

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def assemble(self, episode: Episode, fallback_prompt: list[int]) -> list[tuple[list[int], list[int], list[int],
                                                                                  list[float]]]:
        """(prompt, response, mask, log-probs) of each chain of the episode's calls, in order: a call
        whose prompt extends the last call's prompt and sampled tokens continues the chain, any
        other starts the next (a context break, counted)."""
        if not episode.calls:
            return [(fallback_prompt, [], [], [])]
        chains, context = [], None
        for prompt_ids, out in episode.calls:
            if context is None or prompt_ids[:len(context)] != context:
                if context is not None:
                    self.breaks += 1
                chains.append((list(prompt_ids), [], [], []))
                context = list(prompt_ids)
            _, response, mask, logprobs = chains[-1]
            added = prompt_ids[len(context):]
            response += added + list(out.token_ids)
            mask += [0] * len(added) + [1] * len(out.token_ids)
            logprobs += [0.0] * len(added) + list(out.log_probs)
            context = list(prompt_ids) + list(out.token_ids)
        return chains


def answered_as(message: dict, text: str) -> bool:
    """Whether an assistant message is the answer whose text was ``text``: its content is that
    text (surrounding whitespace aside), or, with tool calls, a part of it (the routes answer the
    text before the calls as content). A message the agent edited is not: it is a new context."""
    content = message.get("content") or ""
    if not isinstance(content, str):  # content parts: not the text the routes answered
        return False
    return content.strip() in text if message.get("tool_calls") else content.strip() == text.strip()


def turn_glue(turn: list[int], sampled: list[int], tokenizer) -> list[int]:
    """What the template puts after the sampled tokens of an assistant turn: after the turn's last
    copy of the token the model ended on (its end marker), or, for a turn cut at its length, from
    the template's end marker on."""
    if sampled and sampled[-1] in turn:
        at = len(turn) - 1 - turn[::-1].index(sampled[-1])
        return turn[at + 1:]
    ends = {tokenizer.eos_token_id, *getattr(tokenizer, "all_special_ids", [])}
    marker = next((i for i in range(len(turn) - 1, -1, -1) if turn[i] in ends and i > 0), None)
    return turn[marker:] if marker is not None else []


async def read_tail(stream: asyncio.StreamReader, keep: int = 1 << 16) -> bytes:
    """The last ``keep`` bytes of ``stream`` (read to its end): a command's reward is its last line,
    and a verbose agent's log is not held whole."""
    tail = b""
    while chunk := await stream.read(1 << 16):
        tail = (tail + chunk)[-keep:]
    return tail


async def feed(stdin: asyncio.StreamWriter, data: bytes) -> None:
    """Write the row to a command's stdin and close it; a command that exits without reading it is fine."""
    with contextlib.suppress(BrokenPipeError, ConnectionResetError):
        stdin.write(data)
        await stdin.drain()
    stdin.close()


def load_agent_function(spec: str):
    """``file.py:name`` or ``module:name`` -> the function."""
    import importlib

    from rlvr.registry import import_file

    where, _, name = spec.rpartition(":")
    if not where or not name:
        raise ValueError(f"actor_rollout_ref.rollout.agent.gateway.function = {spec!r}: write file.py:name or module:name")
    module = import_file(Path(where).expanduser(), "rlvr_user_agent") if where.endswith(".py") \
        else importlib.import_module(where)
    fn = getattr(module, name, None)
    if not callable(fn):
        raise ValueError(f"actor_rollout_ref.rollout.agent.gateway.function = {spec!r}: {where} has no function {name!r}")
    return fn


def jsonable(row: dict) -> dict:
    def convert(value):
        if hasattr(value, "tolist"):
            return value.tolist()
        if isinstance(value, dict):
            return {k: convert(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [convert(v) for v in value]
        return value
    return {k: convert(v) for k, v in row.items() if k != "raw_prompt_ids"}


def as_reward(value) -> float | None:
    """The agent's return value as a reward: None (the reward function scores the episode), a
    number of any kind (Python's, a bool, a numpy scalar or 0-d array, a one-element tensor), else
    ValueError."""
    if value is None:
        return None
    if getattr(value, "ndim", None) == 0 or (hasattr(value, "numel") and value.numel() == 1):
        value = value.item()  # numpy and torch scalars
    if not isinstance(value, numbers.Real):
        raise ValueError(f"the agent returned {type(value).__name__} {value!r}: return a number or None")
    return float(value)


@register("openai_agent")
class OpenAIAgentLoop(AgentLoopBase):
    """One episode of the user's agent through the gateway (module docstring)."""

    def __init__(self, config, server_manager, tokenizer, gateway: Gateway | None = None, **kwargs):
        super().__init__(config, server_manager, tokenizer)
        self.gateway = gateway

    async def run(self, sampling_params, **kwargs) -> AgentLoopOutput:
        cfg = self.gateway.config
        episode = self.gateway.episode(self.server_manager.row_of_task())
        row = jsonable(kwargs)
        try:
            reward = as_reward(await asyncio.wait_for(self._agent(episode, row, cfg), cfg.timeout))
        except asyncio.TimeoutError:
            episode.failed = f"ran past actor_rollout_ref.rollout.agent.gateway.timeout={cfg.timeout:g} s"
        except Exception as err:
            episode.failed = episode.failed or f"{type(err).__name__}: {err}"
        finally:
            episode.open = False
        (prompt, response, mask, logprobs), *later = self.gateway.assemble(episode, list(kwargs["raw_prompt_ids"]))
        if episode.failed is not None:
            print(f"[rlvr] agent episode of row {episode.row} failed: {episode.failed}", file=sys.stderr, flush=True)
            reward = math.nan  # counted, its group left out
        return AgentLoopOutput(prompt, response, mask, logprobs, reward_score=None if reward is None else float(reward),
                               num_turns=2 * len(episode.calls),
                               metrics={"failed": float(episode.failed is not None),
                                        "episode_calls": float(len(episode.calls))},
                               split_samples=[AgentLoopOutput(*chain, num_turns=2 * len(episode.calls))
                                              for chain in later])

    async def _agent(self, episode: Episode, row: dict, cfg):
        if self.gateway.agent is not None:
            return await self.gateway.agent(self.gateway.base_url, episode.key, row)
        process = await asyncio.create_subprocess_shell(
            cfg.command, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
            env={**os.environ, "OPENAI_BASE_URL": self.gateway.base_url, "OPENAI_API_KEY": episode.key},
            start_new_session=True)
        try:
            out, err, *_ = await asyncio.gather(read_tail(process.stdout), read_tail(process.stderr),
                                                feed(process.stdin, json.dumps(row).encode()), process.wait())
        finally:  # its whole process group: the command if it runs on (timed out, cancelled), and any child it left
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(process.pid, signal.SIGKILL)
            if process.returncode is None:
                await process.wait()
        if process.returncode != 0:
            raise RuntimeError(f"the agent command exited with status {process.returncode}: "
                               f"{err.decode(errors='replace')[-300:]}")
        last = (out.decode(errors="replace").strip().splitlines() or [""])[-1].strip()
        if last in ("", "None", "null"):
            return None
        return float(last)
