"""The rollout of agent loops: every row's loop runs as a coroutine over the engine, under the
schedule ``multi_turn.schedule`` names (the multi-turn tool loop's key: one schedule for every loop).

- ``request`` (the default) on the native engine: each call is a request to the engine core
  (``RequestSession``), admitted among the running rows at the core's next step, so a loop whose
  call is ready never waits for another loop's generation or I/O. A loop's k-th call samples with
  the step's seed + 7919 k from its own row of the batch, as the multi-turn loop's turns do; which
  rows share a step follows when the loops' own I/O ends, which moves logits in their last bits.
- ``turn`` (and vLLM in process, and rollout servers): rounds. A round starts when every loop is
  waiting (on the engine, or done): the calls waiting are sent to the engine together, in row
  order, one ``generate`` per call index, so a row's tokens depend on its seed and row only and a
  run repeats bitwise whatever the loops' I/O timing. A loop that awaits its own I/O rejoins at
  a later round; one that is ready waits for the round under way.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import dataclasses
import gc
from collections.abc import Sequence

import numpy as np

from rlvr.agents.loop import AGENT_LOOPS, BUILT_IN, AgentLoopOutput, TokenOutput
from rlvr.data.dataset import left_pad
from rlvr.protocol import EPISODE_SAMPLE, DataProto, concat_rollouts, episode_rows
from rlvr.rollout.base import BaseRollout, pack_responses
from rlvr.rollout.multi_turn import TURN_SEED_STRIDE
from rlvr.rollout.sampling import SamplingParams

SETTLE_YIELDS = 3  # event-loop passes without a new call or a finished loop before a round starts

_row: contextvars.ContextVar[int] = contextvars.ContextVar("agent_row")


class AgentLoopError(RuntimeError):
    """A loop raised or returned an output that does not fit; names the loop and the row."""


class RoundServer:
    """``server_manager`` of the loops: ``generate`` queues a call and waits for its round."""

    def __init__(self, engine: BaseRollout, params: SamplingParams):
        self.engine, self.params = engine, params
        self.waiting: list[tuple[int, int, list[int], SamplingParams, asyncio.Future]] = []
        self.calls: dict[int, int] = {}  # row -> calls made
        self.requests = 0

    def _call(self, kwargs: dict) -> tuple[int, int]:
        """(the calling loop's row, its call index), counted."""
        if kwargs.get("image_data") is not None:
            raise AgentLoopError("image_data: rlvr's engine takes token ids only")
        row = _row.get()
        call = self.calls.get(row, 0)
        self.calls[row] = call + 1
        return row, call

    async def generate(self, request_id: str, *, prompt_ids: Sequence[int],
                       sampling_params: SamplingParams | None = None, **kwargs) -> TokenOutput:
        row, call = self._call(kwargs)
        future = asyncio.get_running_loop().create_future()
        self.waiting.append((row, call, list(prompt_ids), sampling_params or self.params, future))
        self.requests += 1
        return await future

    @staticmethod
    def row_of_task() -> int:
        """The batch row of the loop this is called from."""
        return _row.get()

    async def run_round(self) -> None:
        """The waiting calls, grouped by call index and sampling parameters, each group one
        ``generate`` in row order. A call whose caller went away (cancelled: an agent's client
        left the gateway) is not generated, or, when it went during the round, not answered."""
        waiting = sorted((w for w in self.waiting if not w[4].done()), key=lambda w: (w[1], w[0]))
        self.waiting = []
        groups: dict[tuple, list] = {}
        for entry in waiting:
            row, call, _, params, _ = entry
            groups.setdefault((call, dataclasses.replace(params, row_ids=(), seed=0)), []).append(entry)
        for (call, _), entries in groups.items():
            params = entries[0][3]
            params = dataclasses.replace(params, seed=int(self.params.seed) + call * TURN_SEED_STRIDE,
                                         row_ids=tuple(e[0] for e in entries),
                                         total_rows=max(self.params.total_rows, max(e[0] for e in entries) + 1))
            prompts = [e[2] for e in entries]
            if hasattr(self.engine, "agenerate"):  # servers: requests from this event loop
                completions = await self.engine.agenerate(prompts, params)
            else:  # the engine in this process: one synchronous batch
                completions = self.engine.generate(prompts, params)
            for entry, c in zip(entries, completions):
                if not entry[4].done():
                    entry[4].set_result(TokenOutput(c.token_ids, c.log_probs, c.finish_reason, c.weight_version))


async def _stop(driver: asyncio.Future) -> None:
    """Cancel the session's driver and wait for it (its error was each waiting request's)."""
    driver.cancel()
    with contextlib.suppress(BaseException):
        await driver


class SessionServer(RoundServer):
    """``server_manager`` of the loops under the per-request schedule: ``generate`` is a request to
    the native engine's core, sampled as the round's would be (the call's seed, the row's uniforms)."""

    def __init__(self, engine: BaseRollout, params: SamplingParams, session, width: int):
        super().__init__(engine, params)
        self.session, self.width = session, width

    async def generate(self, request_id: str, *, prompt_ids: Sequence[int],
                       sampling_params: SamplingParams | None = None, **kwargs) -> TokenOutput:
        row, call = self._call(kwargs)
        self.requests += 1
        params = dataclasses.replace(sampling_params or self.params, row_ids=(),
                                     seed=int(self.params.seed) + call * TURN_SEED_STRIDE)
        c = await self.session.generate(list(prompt_ids), params, row=row, width=self.width)
        return TokenOutput(c.token_ids, c.log_probs, c.finish_reason, c.weight_version)


class AgentLoopRollout:
    """Runs each row's agent loop over ``engine`` (``actor_rollout_ref.rollout.agent``); the batch
    goes to ``fallback`` (the batch rollout, or the multi-turn loop) when every row names a
    built-in rollout (``single_turn_agent``, ``tool_agent``)."""

    def __init__(self, engine: BaseRollout, fallback, config, tokenizer, max_response_length: int):
        self.engine, self.fallback, self.config, self.tokenizer = engine, fallback, config, tokenizer
        self.max_response_length = max_response_length
        self.default = config.actor_rollout_ref.rollout.agent.default_agent_loop
        self.stats = {"agent/calls": 0.0, "agent/truncated": 0.0, "agent/split_samples": 0.0}

    def __getattr__(self, name):  # sync_weights, free_cache, wake_up, close, ...: the engine's
        return getattr(self.fallback, name)

    def generate_in_group(self, prompts: DataProto, rollout=None) -> DataProto:
        return self.generate_sequences(prompts)

    @property
    def per_request(self) -> bool:
        """``multi_turn.schedule=request`` on an engine whose core takes requests one at a time (the
        native engine); vLLM in process and rollout servers run rounds."""
        return (self.config.actor_rollout_ref.rollout.multi_turn.schedule == "request"
                and hasattr(self.engine, "session"))

    def names(self, prompts: DataProto) -> list[str]:
        column = prompts.non_tensor_batch.get("agent_name")
        return [str(n) if n else self.default for n in column] if column is not None else [self.default] * len(prompts)

    def generate_sequences(self, prompts: DataProto) -> DataProto:
        names = self.names(prompts)
        if len(set(names)) == 1 and names[0] in BUILT_IN:  # the batch rollout, or the tool loop, as it is
            return self.fallback.generate_sequences(prompts)
        if "tool_agent" in names:
            return self._mixed(prompts, names)
        return self._loops(prompts, names)

    def _loops(self, prompts: DataProto, names: list[str]) -> DataProto:
        """Every row's loop, packed."""
        params = SamplingParams.from_config(self.engine.config, self.max_response_length, prompts.meta_info)
        return self._pack(prompts, names, asyncio.run(self._run(prompts, names, params)))

    def _mixed(self, prompts: DataProto, names: list[str]) -> DataProto:
        """A batch whose rows name tool_agent and other loops: the tool_agent rows go to the
        multi-turn loop (per request on the native engine), the others to their loops, one after
        the other; the two outputs are joined in the batch's row order. Each part samples from rows
        of the whole batch of its own (the loops' rows first, then the tool rows'), so no two rows
        share random numbers. A column one part does not have is None on the other's rows
        (``agent_name`` is tool_agent there)."""
        tool = [i for i, n in enumerate(names) if n == "tool_agent"]
        loops = [i for i, n in enumerate(names) if n != "tool_agent"]
        offset = int(prompts.meta_info.get("row_offset", 0))
        total = max(int(prompts.meta_info.get("total_rows", 0)), offset + len(prompts))

        def rows_of(rows: list[int], start: int) -> DataProto:
            sub = prompts.select_idxs(rows)
            sub.meta_info = {**prompts.meta_info, "row_offset": offset + start, "total_rows": total}
            return sub

        tool_prompts = rows_of(tool, len(loops))
        tool_prompts.non_tensor_batch.pop("agent_name", None)
        parts = [self._loops(rows_of(loops, 0), [names[i] for i in loops]),
                 self.fallback.generate_sequences(tool_prompts)]
        parts[1].non_tensor_batch["agent_name"] = np.array(["tool_agent"] * len(tool), dtype=object)
        parts[1].non_tensor_batch[EPISODE_SAMPLE] = np.zeros(len(tool), dtype=np.int64)
        episodes = episode_rows(parts[0])  # the loops' rows may hold several samples of one episode
        origin = np.array(loops, dtype=np.int64)[episodes if episodes is not None else np.arange(len(loops))]
        origin = np.concatenate([origin, np.array(tool, dtype=np.int64)])
        metrics = {}
        for part in parts:
            metrics.update(part.meta_info.pop("rollout_metrics", {}))
        keys = sorted({k for part in parts for k in part.non_tensor_batch})
        for part in parts:
            for key in keys:
                if key not in part.non_tensor_batch:
                    part.non_tensor_batch[key] = np.array([None] * len(part), dtype=object)
                elif part.non_tensor_batch[key].dtype != object:
                    part.non_tensor_batch[key] = part.non_tensor_batch[key].astype(object)
        out = concat_rollouts(parts, self.engine.pad_id)
        out.reorder(np.argsort(origin, kind="stable"))  # the batch's row order, an episode's samples in theirs
        if metrics:
            out.meta_info["rollout_metrics"] = metrics
        return out

    async def _run(self, prompts: DataProto, names: list[str], params: SamplingParams) -> list[AgentLoopOutput]:
        async with contextlib.AsyncExitStack() as stack:
            if self.per_request:
                session = self.engine.session()
                stack.callback(session.close)
                server = SessionServer(self.engine, params, session,
                                       max(params.total_rows, params.row_offset + len(prompts)))
                stack.push_async_callback(_stop, asyncio.ensure_future(session.drive()))
            else:
                server = RoundServer(self.engine, params)
            gateway = None
            if "openai_agent" in names:  # the user's agents reach the engine through rlvr serve's OpenAI routes
                from rlvr.agents.gateway import Gateway

                data = self.config.data
                gateway = await stack.enter_async_context(Gateway(server, params, self.tokenizer, self.config,
                                                                  data.max_prompt_length + data.max_response_length))
            results = await self._drive(prompts, names, params, server, gateway)
            if gateway is not None:  # agents' clients left unclosed close now, while their event loop runs
                gc.collect()
                for _ in range(3):
                    await asyncio.sleep(0)
        # (the exit stack stopped the session's driver, then closed the session)
        if gateway is not None:
            self.stats["agent/context_breaks"] = float(gateway.breaks)
        else:  # this rollout's: not a count an earlier rollout's gateway left
            self.stats.pop("agent/context_breaks", None)
        self.stats["agent/calls"] = float(server.requests)
        return results

    async def _drive(self, prompts: DataProto, names: list[str], params: SamplingParams, server: RoundServer,
                     gateway) -> list[AgentLoopOutput]:
        """Every row's loop as a task; per request, each call goes to the core as it comes, else a
        round whenever every loop is waiting."""
        ids = prompts.batch["input_ids"].cpu()
        mask = prompts.batch["attention_mask"].cpu().bool()
        columns = dict(prompts.non_tensor_batch)
        results: list = [None] * len(prompts)

        async def one(i: int):
            _row.set(params.row_offset + i)
            kwargs = {k: v[i] for k, v in columns.items()}
            kwargs.setdefault("raw_prompt_ids", ids[i][mask[i]].tolist())
            loop = AGENT_LOOPS.get(names[i])(self.config, server, self.tokenizer, gateway=gateway)
            try:
                results[i] = await loop.run(params, **kwargs)
            except AgentLoopError:
                raise
            except Exception as err:
                raise AgentLoopError(f"agent loop {names[i]!r} raised on row {i}: {type(err).__name__}: {err}") from err

        tasks = [asyncio.ensure_future(one(i)) for i in range(len(prompts))]
        try:
            if isinstance(server, SessionServer):
                await asyncio.gather(*tasks)
                return results
            while True:
                await self._settle(server, tasks)
                for task in tasks:
                    if task.done() and task.exception() is not None:
                        raise task.exception()
                if server.waiting:
                    await server.run_round()
                elif all(t.done() for t in tasks):
                    break
                else:  # loops awaiting their own I/O
                    await asyncio.sleep(0.005)
        finally:
            for task in tasks:
                task.cancel()
        return results

    @staticmethod
    async def _settle(server: RoundServer, tasks) -> None:
        """Let every loop run until it waits (no new call and no loop finishing for a few passes)."""
        quiet, last = 0, None
        while quiet < SETTLE_YIELDS:
            await asyncio.sleep(0)
            now = (len(server.waiting), sum(t.done() for t in tasks))
            quiet = quiet + 1 if now == last else 0
            last = now

    def _pack(self, prompts: DataProto, names: list[str], outputs: list[AgentLoopOutput]) -> DataProto:
        """The loops' prompts left-padded, their responses (cut at ``max_response_length``, counted)
        right-padded beside them; ``response_mask`` is the loops' own. An episode with split samples
        gives a row for each, after its first (``episode_sample`` 0, 1, ...: ``protocol.episode_rows``),
        each with the episode's reward, name and extra fields."""
        for i, (name, out) in enumerate(zip(names, outputs)):
            if not isinstance(out, AgentLoopOutput):
                raise AgentLoopError(f"agent loop {name!r}, row {i} returned {type(out).__name__}, not an AgentLoopOutput")
        episodes = [(i, k, sample) for i, out in enumerate(outputs) for k, sample in enumerate([out, *out.split_samples])]
        self.stats["agent/split_samples"] = float(len(episodes) - len(outputs))
        R, truncated = self.max_response_length, 0
        resp, lps, masks = [], [], []
        for i, k, out in episodes:
            where = f"agent loop {names[i]!r}, row {i}" + (f", split sample {k}" if k else "")
            if not isinstance(out, AgentLoopOutput):
                raise AgentLoopError(f"{where} is {type(out).__name__}, not an AgentLoopOutput")
            if not out.prompt_ids:
                raise AgentLoopError(f"{where} returned no prompt_ids")
            logprobs = out.response_logprobs
            if logprobs is None or not len(out.response_ids) == len(out.response_mask) == len(logprobs):
                raise AgentLoopError(f"{where}: response_ids ({len(out.response_ids)}), response_mask "
                                     f"({len(out.response_mask)}) and response_logprobs "
                                     f"({None if logprobs is None else len(logprobs)}) must have one entry per token")
            if set(out.response_mask) - {0, 1}:
                raise AgentLoopError(f"{where}: response_mask holds {sorted(set(out.response_mask) - {0, 1})}; "
                                     "use 1 (sampled by the model) and 0 (added by the loop)")
            truncated += len(out.response_ids) > R
            resp.append(list(out.response_ids[:R]))
            masks.append(list(out.response_mask[:R]))
            lps.append([float(x) if m else 0.0 for x, m in zip(logprobs[:R], out.response_mask[:R])])
        self.stats["agent/truncated"] = float(truncated)
        pad_id = self.engine.pad_id
        device = prompts.batch["input_ids"].device
        input_ids, attention_mask, position_ids = left_pad([o.prompt_ids for _, _, o in episodes], pad_id)
        loop_prompts = DataProto.from_dict({"input_ids": input_ids.to(device), "attention_mask":
                                            attention_mask.to(device), "position_ids": position_ids.to(device)})
        non_tensors = {"finish_reason": ["length" if len(o.response_ids) > R else "stop" for _, _, o in episodes],
                       "num_turns": np.array([outputs[i].num_turns for i, _, _ in episodes], dtype=np.int64),
                       "agent_name": np.array([names[i] for i, _, _ in episodes], dtype=object),
                       "multi_turn_metrics": [{} for _ in episodes],  # num_turns and added tokens are logged
                       # None: the reward function scores it (an episode's last sample: protocol.final_samples)
                       "reward_score": [outputs[i].reward_score for i, _, _ in episodes],
                       EPISODE_SAMPLE: np.array([k for _, k, _ in episodes], dtype=np.int64)}
        for key in sorted({k for o in outputs for k in o.extra_fields}):  # one entry per row, lists kept whole
            non_tensors[key] = [outputs[i].extra_fields.get(key) for i, _, _ in episodes]
        out = pack_responses(loop_prompts, resp, lps, masks, pad_id, non_tensors)
        metrics = {f"agent/{k}": float(np.mean([o.metrics.get(k, 0.0) for o in outputs]))
                   for k in sorted({k for o in outputs for k in o.metrics})}
        out.meta_info["rollout_metrics"] = {**out.meta_info.get("rollout_metrics", {}), **self.stats, **metrics}
        return out
