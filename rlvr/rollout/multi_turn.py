"""Multi-turn rollouts with tool calling, on any engine of the registry (native, vllm).

Each sample is a ``Request`` that moves PENDING -> RUNNING -> (TOOL_CALLING -> RUNNING)* ->
COMPLETED, or FAILED with a reason (verl's AsyncRolloutRequest states). ``MultiTurnRollout``
moves them on one of two schedules (``multi_turn.schedule``):

- ``request`` (on the native engine): each request's turns are a coroutine of their own over the
  engine core (``NativeRollout.session()``): its turn is sampled, its own calls run, and the
  answer goes back to the core as its next turn, joining the running rows at the next decode
  step; no request waits for another's turn or tool (verl's agent loop moves this way);
- ``turn``: every live request together, one turn at a time: one batched ``engine.generate``
  over the requests still RUNNING, then all of the turn's calls, then the next turn.

Either way a request's k-th turn samples with the seed + ``TURN_SEED_STRIDE`` k from its own row
of the batch, so both schedules draw the same tokens; the first turn keeps the shared-prompt
prefill (a group's n requests have the same prompt); the tool-call format's closing tags are stop
strings, so a turn ends right after a call; calls are parsed (``rlvr.tools.parsers``) and run
concurrently on one event loop with a per-call timeout (a tool may cap its calls at once,
``BaseTool.call_slot``: the timeout starts once the call has a slot); the results are appended as
a token delta rendered by the chat template (earlier tokens are never re-tokenised).

Token in, token out: the model's tokens are kept exactly as sampled, with their log-probs;
template and tool tokens get ``response_mask`` 0. ``data.max_response_length`` bounds model
plus tool tokens.

Departure from verl: every configured tool is created for every trajectory (verl creates those
named in ``tools_kwargs``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import enum
import json
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

from rlvr.config.schema import MultiTurnConfig, RolloutConfig
from rlvr.data.chat_template import ChatFormat
from rlvr.protocol import DataProto
from rlvr.rollout.base import BaseRollout, Completion, pack_responses
from rlvr.rollout.sampling import SamplingParams
from rlvr.tools.base import TOOL_METHODS, BaseTool, ToolBusyError, ToolError, not_coroutines
from rlvr.tools.config import load_tools
from rlvr.tools.interaction import INTERACTION_METHODS, BaseInteraction, load_interactions
from rlvr.tools.parsers import ToolCall, ToolParser, get_tool_parser
from rlvr.tools.schema import check_arguments


TURN_SEED_STRIDE = 7919
"""A request's k-th turn samples with the step's seed + 7919 k (the agent loops' k-th call too)."""


@dataclass
class ToolSetup:
    """The tools of a run and the chat format that shows them to the model (prompts and deltas)."""

    tools: dict[str, BaseTool]
    chat: ChatFormat

    @classmethod
    def from_config(cls, tokenizer, config: RolloutConfig,
                    template_kwargs: dict[str, Any] | None = None) -> "ToolSetup | None":
        """None unless ``multi_turn.enable``; the tools YAML is read (and every tool built) here.
        ``template_kwargs``: ``data.apply_chat_template_kwargs``, for every turn the format renders."""
        mt = config.multi_turn
        if not mt.enable:
            return None
        tools = load_tools(mt.tool_config_path) if mt.tool_config_path else {}  # an interaction alone needs none
        return cls(tools, ChatFormat(tokenizer, [t.tool_schema.to_dict() for t in tools.values()], mt.format,
                                     template_kwargs=template_kwargs))


class RequestState(enum.Enum):
    PENDING = "pending"
    RUNNING = "running"
    TOOL_CALLING = "tool_calling"
    INTERACTING = "interacting"
    COMPLETED = "completed"
    FAILED = "failed"


@dataclass
class Request:
    """One trajectory: its conversation, its tokens (model's and tools') and its tool state."""

    request_id: str
    messages: list[dict[str, Any]]
    prompt_ids: list[int]
    max_response_length: int
    tools_kwargs: dict[str, dict[str, Any]] = field(default_factory=dict)
    state: RequestState = RequestState.PENDING
    response_ids: list[int] = field(default_factory=list)
    response_mask: list[int] = field(default_factory=list)  # 1: the model's token, 0: template/tool token
    response_log_probs: list[float] = field(default_factory=list)
    num_turns: int = 0  # assistant turns
    finish_reason: str | None = None  # stop | length | max_turns | failed
    failure: str | None = None
    pending_calls: list[ToolCall] = field(default_factory=list)
    closed_by: str = ""  # the end-of-turn text the model wrote itself (its EOS), if any
    instance_ids: dict[str, str] = field(default_factory=dict)
    interaction: str | None = None  # the interaction that answers the model (extra_info.interaction_kwargs.name)
    interaction_kwargs: dict[str, Any] = field(default_factory=dict)
    interaction_id: str | None = None
    user_turns: int = 0  # tool results and interaction answers (verl's count, bounded by max_user_turns)
    turn_scores: list[float] = field(default_factory=list)
    step_rewards: list[float] = field(default_factory=list)
    tool_rewards: dict[str, float] = field(default_factory=dict)
    metrics: Counter = field(default_factory=Counter)

    def __post_init__(self) -> None:
        self.num_prompt_messages = len(self.messages)

    @property
    def new_messages(self) -> list[dict[str, Any]]:
        """The turns this rollout added (the model's and the tools'), after the prompt's messages."""
        return self.messages[self.num_prompt_messages:]

    @property
    def budget_left(self) -> int:
        return self.max_response_length - len(self.response_ids)

    def generation_ids(self) -> list[int]:
        return self.prompt_ids + self.response_ids

    def start(self) -> None:
        self._move(RequestState.PENDING, RequestState.RUNNING)

    def _move(self, expected: RequestState, new: RequestState) -> None:
        if self.state is not expected:
            raise RuntimeError(f"request {self.request_id}: {new.value} from {self.state.value} (expected {expected.value})")
        self.state = new

    def _complete(self, reason: str) -> None:
        self.state, self.finish_reason = RequestState.COMPLETED, reason

    def fail(self, reason: str) -> None:
        self.state, self.finish_reason, self.failure = RequestState.FAILED, "failed", reason

    def add_assistant_turn(self, completion: Completion, text: str, closed_by: str, calls: list[ToolCall],
                           max_turns: int | None, max_user_turns: int | None = None) -> None:
        """The model's turn: its tokens (trained on), then COMPLETED, TOOL_CALLING or (an interaction
        answers a turn without calls) INTERACTING."""
        self._move(RequestState.RUNNING, RequestState.RUNNING)
        self.response_ids += completion.token_ids
        self.response_mask += [1] * len(completion.token_ids)
        self.response_log_probs += completion.log_probs
        self.num_turns += 1
        self.messages.append({"role": "assistant", "content": text})
        self.closed_by = closed_by
        if completion.finish_reason == "length":
            self.metrics["truncated"] = 1
            self._complete("length")
        elif not calls and self.interaction is None:
            self._complete("stop")
        elif max_turns is not None and self.num_turns >= max_turns:
            self._complete("max_turns")  # no turn left to read the result (or the answer) in
        elif max_user_turns is not None and self.user_turns >= max_user_turns:
            self._complete("max_user_turns")
        elif self.budget_left <= 0:
            self.metrics["truncated"] = 1
            self._complete("length")
        elif not calls:
            self.state = RequestState.INTERACTING
        else:
            self.pending_calls = calls
            self.state = RequestState.TOOL_CALLING

    def add_tool_responses(self, tool_messages: list[dict[str, Any]], delta_ids: list[int]) -> None:
        """Tool results as a token delta (never trained on); the turn budget decides what follows."""
        self._move(RequestState.TOOL_CALLING, RequestState.RUNNING)
        self.pending_calls = []
        self._add_context(tool_messages, delta_ids)

    def add_user_turn(self, message: dict[str, Any], delta_ids: list[int], score: float | None,
                      terminate: bool) -> None:
        """An interaction's answer as a token delta (never trained on) and its turn score; it ends
        the episode when the interaction says so."""
        self._move(RequestState.INTERACTING, RequestState.RUNNING)
        if score is not None:
            self.turn_scores.append(float(score))
        self._add_context([message], delta_ids)
        if terminate and self.state is RequestState.RUNNING:
            self._complete("interaction")

    def _add_context(self, messages: list[dict[str, Any]], delta_ids: list[int]) -> None:
        self.user_turns += 1
        self.messages.extend(messages)
        kept = delta_ids[:max(self.budget_left, 0)]
        self.response_ids += kept
        self.response_mask += [0] * len(kept)
        self.response_log_probs += [0.0] * len(kept)
        if len(kept) < len(delta_ids) or self.budget_left <= 0:
            self.metrics["truncated"] = 1
            self._complete("length")


def truncate_text(text: str, limit: int, side: str) -> str:
    """Cut ``text`` to ``limit`` characters, marker included, keeping its ``side`` as verl's tool loop
    names them: left keeps the start, right keeps the end, middle both ends."""
    if len(text) <= limit:
        return text
    marker = "...(truncated)"
    if limit <= len(marker):  # no room for the marker: the limit holds, the text is cut bare
        return text[len(text) - limit:] if side == "right" else text[:limit]
    keep = limit - len(marker)
    if side == "left":
        return text[:keep] + marker
    if side == "right":
        return marker + text[len(text) - keep:]
    head = keep // 2
    return text[:head] + marker + text[len(text) - (keep - head):]


def read_tool_result(result: Any) -> tuple[str, float]:
    """(text for the model, step reward) of what ``execute`` returned, ``(text, reward, metrics)``;
    the text may be verl's ``ToolResponse`` (its ``.text``), None (no text) or UTF-8 bytes."""
    if not (isinstance(result, (tuple, list)) and len(result) == 3):
        raise TypeError(f"execute returned {result!r:.80}, not (text, reward, metrics)")
    text, reward, _ = result
    text = getattr(text, "text", text)
    try:
        reward = float(reward)
    except (TypeError, ValueError):
        raise TypeError(f"execute returned the reward {reward!r:.40}, not a number: (text, reward, metrics)") from None
    if text is None:
        return "", reward
    return (text.decode("utf-8", "replace") if isinstance(text, bytes) else str(text)), reward


class MultiTurnRollout:
    """Drives ``Request``s through an engine and tools; ``generate_sequences`` as the single-turn engine."""

    def __init__(self, engine: BaseRollout, tools: dict[str, BaseTool], config: MultiTurnConfig,
                 chat: ChatFormat, max_response_length: int, interactions: dict[str, BaseInteraction] | None = None):
        self.engine, self.tools, self.config, self.chat = engine, tools, config, chat
        self.interactions = interactions if interactions is not None else load_interactions(config.interaction_config_path)
        checks = (("tool", tools, TOOL_METHODS), ("interaction", self.interactions, INTERACTION_METHODS))
        for what, objects, names in checks:
            for name, obj in objects.items():  # a plain def would fail every call of the run
                sync = not_coroutines(obj, names)
                if sync:
                    raise TypeError(f"{what} {name!r} ({type(obj).__name__}): {sync}")
        self.tokenizer = engine.tokenizer
        self.max_response_length = max_response_length
        self.parser: ToolParser = get_tool_parser(config.format, [t.tool_schema for t in tools.values()])
        self.eos_texts = {i: self.tokenizer.decode([i]) for i in engine.eos_ids}
        self._warned: set[str] = set()

    # the hybrid worker's hooks go to the engine
    def sync_weights(self, version: int | None = None) -> None:
        self.engine.sync_weights(version)

    def free_cache(self) -> None:
        self.engine.free_cache()

    def wake_up(self, tags) -> None:
        self.engine.wake_up(tags)

    def close(self) -> None:
        self.engine.close()

    def generate_in_group(self, prompts: DataProto) -> DataProto:
        """``generate_sequences`` where the engine may span several ranks (see the engine's)."""
        return self.engine.generate_in_group(prompts, self)

    # ------------------------------------------------------------------ the loop
    def generate_sequences(self, prompts: DataProto) -> DataProto:
        prompts.require("input_ids", "attention_mask", "position_ids", stage="multi-turn rollout")
        params = SamplingParams.from_config(self.engine.config, self.max_response_length, prompts.meta_info)
        params = dataclasses.replace(params, stop=tuple(dict.fromkeys([*params.stop, *self.parser.stop_strings()])))
        requests = self.requests(prompts)
        uids = prompts.non_tensor_batch.get("uid")
        loop = asyncio.new_event_loop()
        try:
            loop.run_until_complete(self._create(requests))
            if self.per_request:
                loop.run_until_complete(self._run_requests(requests, params, uids))
            else:
                with self.engine.turn_cache():  # each turn prefills only what the last turn did not see
                    self._run_turns(loop, requests, params, uids)
            loop.run_until_complete(self._finish(requests))
        finally:
            self._close(loop, requests)
        return self.to_dataproto(prompts, requests)

    @property
    def per_request(self) -> bool:
        """``multi_turn.schedule=request`` on an engine whose core takes requests one at a time (the
        native engine); other engines (vLLM in process, servers) move turn by turn."""
        return self.config.schedule == "request" and hasattr(self.engine, "session")

    async def _run_requests(self, requests: list[Request], params: SamplingParams, uids) -> None:
        """The per-request schedule: each request's turns run as a coroutine of their own (generate,
        then its own tool calls or interaction, then its next turn), and the engine core admits a
        request's next turn at its next step, whatever the other requests are doing."""
        session = self.engine.session()
        width = max(params.total_rows, params.row_offset + len(requests))
        driver = asyncio.ensure_future(session.drive())
        try:
            await asyncio.gather(*(self._run_request(session, i, req, params, uids, width)
                                   for i, req in enumerate(requests)))
        finally:
            driver.cancel()
            try:
                await driver
            except BaseException:  # noqa: BLE001 (its error is each waiting request's; a Ctrl-C already left the loop)
                pass
            session.close()

    async def _run_request(self, session, i: int, req: Request, params: SamplingParams, uids, width: int) -> None:
        """One request's turns. Its k-th turn samples as the turn-by-turn loop's k-th turn does: the
        seed + 7919 k, the uniforms of its row of the batch, the first turn's prompt prefilled once
        with its group's (the n requests of a prompt start together)."""
        turn = 0
        while req.state is RequestState.RUNNING:
            turn_params = dataclasses.replace(params, seed=int(params.seed) + turn * TURN_SEED_STRIDE,
                                              max_new_tokens=min(req.budget_left, params.max_new_tokens))
            group = ("g", uids[i]) if turn == 0 and uids is not None else None
            completion = await session.generate(req.generation_ids(), turn_params, row=params.row_offset + i,
                                                width=width, group=group)
            self._read_turn(req, completion)
            if req.state is RequestState.TOOL_CALLING:
                await self._call_tools([req])
            elif req.state is RequestState.INTERACTING:
                await self._interact([req])
            turn += 1
        session.forget(req.generation_ids())

    def _run_turns(self, loop: asyncio.AbstractEventLoop, requests: list[Request], params: SamplingParams,
                   uids) -> None:
        turn = 0
        while True:
            running = [i for i, r in enumerate(requests) if r.state is RequestState.RUNNING]
            if not running:
                break
            groups = [uids[i] for i in running] if turn == 0 and uids is not None else None
            self._generate_turn(requests, running, params, turn, groups)
            calling = [r for r in requests if r.state is RequestState.TOOL_CALLING]
            interacting = [r for r in requests if r.state is RequestState.INTERACTING]
            if calling or interacting:
                loop.run_until_complete(self._answer_turns(calling, interacting))
            turn += 1

    def _close(self, loop: asyncio.AbstractEventLoop, requests: list[Request]) -> None:
        """Cancel and await the tasks still pending (a Ctrl-C mid tool turn leaves the turn's calls
        running: each must reach its own cleanup, such as the python tool's sandbox teardown),
        release every tool instance still held, then close the loop."""
        try:
            pending = asyncio.all_tasks(loop)
            for task in pending:
                task.cancel()
            if pending:
                loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
            loop.run_until_complete(self._release_all(requests))
            loop.run_until_complete(loop.shutdown_asyncgens())
        finally:
            loop.close()

    def requests(self, prompts: DataProto) -> list[Request]:
        if "raw_prompt" not in prompts.non_tensor_batch:
            raise ValueError("multi-turn rollouts need each prompt's messages: set data.return_raw_chat=true")
        ids, mask = prompts.batch["input_ids"].cpu(), prompts.batch["attention_mask"].cpu()
        kwargs = prompts.non_tensor_batch.get("tools_kwargs")
        uids = prompts.non_tensor_batch.get("uid")
        out = []
        for i in range(len(prompts)):
            tk = (kwargs[i] if kwargs is not None else None) or {}
            unknown = set(tk) - set(self.tools)
            if unknown:
                raise ValueError(f"sample {i} (uid {uids[i] if uids is not None else i}): tools_kwargs names tools "
                                 f"{sorted(unknown)} that the tool config does not define (known: {sorted(self.tools)})")
            req = Request(f"{uids[i] if uids is not None else 'r'}-{i}", [dict(m) for m in prompts.non_tensor_batch["raw_prompt"][i]],
                          ids[i][mask[i].bool()].tolist(), self.max_response_length, dict(tk))
            req.interaction, req.interaction_kwargs = self._interaction_of(prompts, i, uids)
            out.append(req)
        return out

    def _interaction_of(self, prompts: DataProto, i: int, uids) -> tuple[str | None, dict[str, Any]]:
        """Row ``i``'s interaction and its kwargs, from ``extra_info.interaction_kwargs`` (verl's place);
        none without interactions configured or without the kwargs."""
        if not self.interactions:
            return None, {}
        extra = prompts.non_tensor_batch.get("extra_info")
        kwargs = ((extra[i] if extra is not None else None) or {}).get("interaction_kwargs")
        if not kwargs:
            return None, {}
        name = kwargs.get("name")
        if name not in self.interactions:
            raise ValueError(f"sample {i} (uid {uids[i] if uids is not None else i}): extra_info.interaction_kwargs "
                             f"names interaction {name!r}, which the interaction config does not define (known: "
                             f"{sorted(self.interactions)}); interaction_kwargs needs a 'name'")
        return name, dict(kwargs)

    def _generate_turn(self, requests: list[Request], running: list[int], params: SamplingParams, turn: int,
                       groups) -> None:
        """One batched turn over ``requests[i] for i in running``. Each request draws the uniforms
        of its own row of the batch (``row_ids``), so its tokens do not depend on which other
        requests are still running."""
        turn_params = dataclasses.replace(params, seed=int(params.seed) + turn * TURN_SEED_STRIDE,
                                          row_ids=tuple(params.row_offset + i for i in running),
                                          total_rows=max(params.total_rows, params.row_offset + len(requests)))
        live = [requests[i] for i in running]
        completions = self.engine.generate([r.generation_ids() for r in live], turn_params, groups,
                                           max_new_tokens=[r.budget_left for r in live])
        for req, c in zip(live, completions):
            self._read_turn(req, c)

    def _read_turn(self, req: Request, c: Completion) -> None:
        """The model's turn added to ``req``, with the tool calls it wrote."""
        try:
            ids = c.token_ids
            closed_by = self.eos_texts.get(ids[-1], "") if ids else ""
            text = self.tokenizer.decode(ids[:-1] if closed_by else ids, skip_special_tokens=False)
            calls = self.parser.parse(text) if c.finish_reason == "stop" else []
            req.add_assistant_turn(c, text, closed_by, calls, self.config.max_assistant_turns,
                                   self.config.max_user_turns)
        except Exception as err:  # one request's turn cannot be read: it fails, the batch goes on
            self._fail(req, "reading the model's turn", err)

    # ------------------------------------------------------------------ tools
    async def _create(self, requests: list[Request]) -> None:
        async def create(req: Request) -> None:
            try:
                for name, tool in self.tools.items():
                    kw = req.tools_kwargs.get(name, {}).get("create_kwargs", {})
                    created = await tool.create(req.request_id, **kw)
                    # verl's tools return (instance_id, ToolResponse) from create; rlvr's the id
                    req.instance_ids[name] = created[0] if isinstance(created, tuple) else created
                if req.interaction is not None:
                    req.interaction_id = await self.interactions[req.interaction].start_interaction(
                        req.request_id, **req.interaction_kwargs)
                req.start()
            except Exception as err:  # the trajectory cannot run: it fails, the batch goes on
                self._fail(req, "creating its tools", err)

        await asyncio.gather(*(create(r) for r in requests))

    async def _call_tools(self, calling: list[Request]) -> None:
        async def run(req: Request) -> None:
            try:
                calls = req.pending_calls[:self.config.max_parallel_calls]
                req.metrics["dropped_calls"] += len(req.pending_calls) - len(calls)
                texts = await asyncio.gather(*(self._call(req, c) for c in calls))
                limit, side = self.config.max_tool_response_length, self.config.tool_response_truncate_side
                messages = [{"role": "tool", "content": truncate_text(t, limit, side)} for t in texts]
                req.add_tool_responses(messages, self.chat.tool_delta(messages, req.closed_by))
            except Exception as err:  # e.g. a result the tokenizer cannot encode (a lone surrogate)
                self._fail(req, "appending its tool results", err)

        await asyncio.gather(*(run(r) for r in calling))

    async def _answer_turns(self, calling: list[Request], interacting: list[Request]) -> None:
        """The turn's tool calls and interaction answers, all at once."""
        await asyncio.gather(self._call_tools(calling), self._interact(interacting))

    async def _interact(self, interacting: list[Request]) -> None:
        """Each request's interaction answers its last turn: a user turn (rendered as the tool
        results are, never trained on) and a turn score; an interaction that raises or answers
        something else than verl's 4-tuple fails its request only."""
        async def answer(req: Request) -> None:
            try:
                result = await self.interactions[req.interaction].generate_response(
                    req.interaction_id, list(req.messages), **req.interaction_kwargs)
                if not (isinstance(result, tuple) and len(result) == 4 and isinstance(result[1], str)):
                    raise TypeError(f"generate_response returned {result!r:.120}, not (should_terminate_sequence, "
                                    "response_content: str, current_turn_score, additional_data)")
                terminate, content, score, _ = result
                message = {"role": "user", "content": content}
                req.metrics["interaction_turns"] += 1
                req.add_user_turn(message, self.chat.tool_delta([message], req.closed_by), score, bool(terminate))
            except Exception as err:
                self._fail(req, f"interaction {req.interaction!r}", err)

        await asyncio.gather(*(answer(r) for r in interacting))

    async def _call(self, req: Request, call: ToolCall) -> str:
        """One call -> the text the model sees; every failure is an error message and a counter."""
        req.metrics["tool_calls"] += 1
        if call.error:
            req.metrics[call.error] += 1
            return f"Error: {call.message}"
        tool = self.tools.get(call.name)
        if tool is None:
            req.metrics["unknown_tool"] += 1
            return f"Error: there is no tool named {call.name!r}; the tools are {sorted(self.tools)}"
        req.metrics[f"tool_calls/{call.name}"] += 1
        try:
            params = json.loads(call.arguments)
        except json.JSONDecodeError as err:
            req.metrics["invalid_json"] += 1
            return f"Error: the arguments are not valid JSON ({err.msg})"
        problems = check_arguments(tool.tool_schema, params)
        if problems:
            req.metrics["invalid_arguments"] += 1
            return f"Error: {'; '.join(problems)}"
        kw = req.tools_kwargs.get(call.name, {}).get("execute_kwargs", {})
        start = time.perf_counter()
        req.metrics["tool_runs"] += 1
        deadline = None
        try:
            async with tool.call_slot():  # the wait for a slot (a tool's cap on calls at once) is not timed
                deadline = asyncio.timeout(self.config.tool_timeout_s)  # its clock starts here
                async with deadline:
                    result = await tool.execute(req.instance_ids[call.name], params, **kw)
            text, reward = read_tool_result(result)
            req.step_rewards.append(reward)
            return text
        except TimeoutError as err:
            if deadline is None or not deadline.expired():  # the tool's own (a socket's, a client's): its error
                return self._tool_bug(req, call, err)
            req.metrics["tool_timeouts"] += 1
            return f"Error: {call.name} did not answer within {self.config.tool_timeout_s:g} s"
        except ToolError as err:
            req.metrics["tool_errors"] += 1
            if isinstance(err, ToolBusyError):
                req.metrics["tool_busy"] += 1
            return f"Error: {err}"
        except (Exception, SystemExit) as err:  # SystemExit: a tool wrapping a command line (argparse exits)
            return self._tool_bug(req, call, err)
        finally:
            req.metrics["tool_latency_s"] += time.perf_counter() - start

    def _tool_bug(self, req: Request, call: ToolCall, err: BaseException) -> str:
        """A tool's bug: the model sees an error, the run goes on, the user is told."""
        req.metrics["tool_errors"] += 1
        self._warn(f"{call.name}:{type(err).__name__}", f"tool {call.name!r} raised {type(err).__name__}: {err} "
                   f"(request {req.request_id}, arguments {call.arguments}); the model sees it as a tool error")
        return f"Error: {call.name} failed: {type(err).__name__}: {err}"

    async def _finish(self, requests: list[Request]) -> None:
        """Each trajectory's tool rewards, then the release of its tools (whatever calc_reward did)."""
        async def finish(req: Request) -> None:
            for name, instance in req.instance_ids.items():
                kw = req.tools_kwargs.get(name, {}).get("calc_reward_kwargs", {})
                try:
                    req.tool_rewards[name] = float(await self.tools[name].calc_reward(instance, **kw))
                except Exception as err:
                    req.metrics["tool_errors"] += 1
                    self._warn(f"calc_reward:{name}", f"tool {name!r}: calc_reward raised {type(err).__name__}: "
                               f"{err} (request {req.request_id}); its reward is left out")
            await self._release(req)
            if self.config.enable_tokenization_sanity_check and req.state is RequestState.COMPLETED:
                try:
                    req.metrics["tokenization_mismatch"] = int(not self._tokens_match(req))
                except Exception as err:
                    self._fail(req, "the tokenization sanity check", err)

        await asyncio.gather(*(finish(r) for r in requests))

    async def _release_all(self, requests: list[Request]) -> None:
        await asyncio.gather(*(self._release(r) for r in requests))

    async def _release(self, req: Request) -> None:
        """Release the request's tool instances it still holds (each once, also after a failure),
        and end its interaction."""
        if req.interaction_id is not None:
            instance, req.interaction_id = req.interaction_id, None
            try:
                await self.interactions[req.interaction].finalize_interaction(instance)
            except Exception as err:
                req.metrics["tool_errors"] += 1
                self._warn(f"finalize:{req.interaction}", f"interaction {req.interaction!r}: finalize_interaction raised "
                           f"{type(err).__name__}: {err} (request {req.request_id})")
        while req.instance_ids:
            name, instance = req.instance_ids.popitem()
            try:
                await self.tools[name].release(instance, **req.tools_kwargs.get(name, {}).get("release_kwargs", {}))
            except Exception as err:
                req.metrics["tool_errors"] += 1
                self._warn(f"release:{name}", f"tool {name!r}: release raised {type(err).__name__}: {err} "
                           f"(request {req.request_id})")

    def _tokens_match(self, req: Request) -> bool:
        """Whether the tokens equal the chat template applied to the final conversation (a
        prefix of it: the template may close the last turn after the model's end token)."""
        rendered = self.chat.encode(self.chat.render(req.messages))
        ours = req.prompt_ids + req.response_ids
        return rendered[:len(ours)] == ours

    def _fail(self, req: Request, what: str, err: Exception) -> None:
        """``req`` FAILED with the reason (counted in multi_turn/failed); the other requests go on."""
        reason = f"{what} failed: {type(err).__name__}: {err}"
        self._warn(f"fail:{what}:{type(err).__name__}", f"request {req.request_id}: {reason}; the request is marked "
                   "failed (multi_turn/failed, not trained on) and the step goes on")
        req.fail(reason)

    def _warn(self, key: str, message: str) -> None:
        if key not in self._warned:  # once per kind per run, not once per sample
            self._warned.add(key)
            print(f"[rlvr] warning: {message}", file=sys.stderr, flush=True)

    # ------------------------------------------------------------------ output
    def to_dataproto(self, prompts: DataProto, requests: Sequence[Request]) -> DataProto:
        """The single-turn layout: ``responses`` with tool tokens, ``response_mask`` 0 on them,
        ``attention_mask`` 1 on every real token; plus the conversation and counters per sample."""
        for r in requests:
            if r.state is RequestState.FAILED:  # cut short by an error: its tokens are kept, not trained on
                r.metrics["failed"] = 1
                r.response_mask = [0] * len(r.response_mask)
        return pack_responses(
            prompts, [r.response_ids for r in requests], [r.response_log_probs for r in requests],
            [r.response_mask for r in requests], self.engine.pad_id,
            {"finish_reason": [r.finish_reason for r in requests],
             # verl's count (its tool agent loop): the prompt, each model turn, each tool or interaction answer
             "num_turns": np.array([1 + r.num_turns + r.user_turns for r in requests], dtype=object),
             "messages": [r.new_messages for r in requests],
             "tool_rewards": [{"final": dict(r.tool_rewards), "steps": list(r.step_rewards)} for r in requests],
             "turn_scores": [list(r.turn_scores) for r in requests],
             "multi_turn_metrics": [dict(r.metrics) for r in requests]})
