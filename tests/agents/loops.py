"""Agent loops the tests register (by decorator and by a loop config file's ``_target_``)."""

import asyncio
import dataclasses
from uuid import uuid4

from rlvr.agents import AgentLoopBase, AgentLoopOutput, SingleTurnAgentLoop, register

NUDGE = [13, 13]  # two tokens the loop adds between its turns (mask 0)


@register("echo_single")
class EchoSingle(SingleTurnAgentLoop):
    """The built-in single-turn loop under another name: forces the agent-loop path."""


class TwoTurnLoop(AgentLoopBase):
    """Generate, add NUDGE (a user's reply, not sampled), generate again from the whole context;
    odd rows wait on I/O (a sleep of their row's length) before the second call, so their calls
    reach the engine in another round than even rows'."""

    async def run(self, sampling_params, **kwargs):
        prompt = list(kwargs["raw_prompt_ids"])
        sampling_params = dataclasses.replace(sampling_params, max_new_tokens=8)  # a turn's budget
        first = await self.server_manager.generate(uuid4().hex, prompt_ids=prompt, sampling_params=sampling_params)
        if kwargs["extra_info"]["index"] % 2:
            await asyncio.sleep(0.02 * (1 + kwargs["extra_info"]["index"] % 3))
        context = prompt + first.token_ids + NUDGE
        second = await self.server_manager.generate(uuid4().hex, prompt_ids=context, sampling_params=sampling_params)
        ids = first.token_ids + NUDGE + second.token_ids
        mask = [1] * len(first.token_ids) + [0] * len(NUDGE) + [1] * len(second.token_ids)
        logprobs = first.log_probs + [0.0] * len(NUDGE) + second.log_probs
        return AgentLoopOutput(prompt, ids, mask, logprobs, num_turns=4, metrics={"second_len": len(second.token_ids)},
                               extra_fields={"first_ids": first.token_ids, "second_ids": second.token_ids})


class Broken(AgentLoopBase):
    """What the run's experiment name says: raise, score its rows itself, or return mismatched lengths."""

    async def run(self, sampling_params, **kwargs):
        prompt = list(kwargs["raw_prompt_ids"])
        out = await self.server_manager.generate(uuid4().hex, prompt_ids=prompt, sampling_params=sampling_params)
        how = self.config.trainer.experiment_name
        if how == "raises":
            raise ValueError("the environment is down")
        if how in ("quarter", "nan"):  # its own score: 0.25 for every row, or NaN for even rows
            score = float("nan") if how == "nan" and kwargs["extra_info"]["index"] % 2 == 0 else 0.25
            return AgentLoopOutput(prompt, out.token_ids, [1] * len(out.token_ids), out.log_probs, reward_score=score)
        return AgentLoopOutput(prompt, out.token_ids, [1] * (len(out.token_ids) + 1), out.log_probs)


FINISHED: list[tuple[str, int]] = []  # (which call, its tokens), in the order the calls returned


@register("long_and_short")
class LongAndShort(AgentLoopBase):
    """Row 0 asks for 40 tokens at once; every other row waits 5 ms on its own I/O, then asks for 2."""

    async def run(self, sampling_params, **kwargs):
        prompt = list(kwargs["raw_prompt_ids"])
        long = self.server_manager.row_of_task() == 0
        if not long:
            await asyncio.sleep(0.005)
        params = dataclasses.replace(sampling_params, max_new_tokens=40 if long else 2)
        out = await self.server_manager.generate(uuid4().hex, prompt_ids=prompt, sampling_params=params)
        FINISHED.append(("long" if long else "short", len(out.token_ids)))
        return AgentLoopOutput(prompt, out.token_ids, [1] * len(out.token_ids), out.log_probs)


class SplitLoop(AgentLoopBase):
    """Two calls, the second from a rewritten context (the prompt and NUDGE, not the first answer):
    an episode of two samples, the second given as the first's ``split_samples``."""

    async def run(self, sampling_params, **kwargs):
        prompt = list(kwargs["raw_prompt_ids"])
        params = dataclasses.replace(sampling_params, max_new_tokens=4)
        first = await self.server_manager.generate(uuid4().hex, prompt_ids=prompt, sampling_params=params)
        context = prompt + NUDGE
        second = await self.server_manager.generate(uuid4().hex, prompt_ids=context, sampling_params=params)
        later = AgentLoopOutput(context, second.token_ids, [1] * len(second.token_ids), second.log_probs)
        return AgentLoopOutput(prompt, first.token_ids, [1] * len(first.token_ids), first.log_probs,
                               split_samples=[later])
