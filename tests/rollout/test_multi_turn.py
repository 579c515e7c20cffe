"""The multi-turn loop: request states, token and mask layout, log-prob alignment with the
training forward, tool errors as messages, budgets, the tool lifecycle and the metrics."""

import asyncio
import json
import os
import signal
import tempfile
import threading
import time

import numpy as np
import pytest
import torch

from rlvr.config.schema import MultiTurnConfig, RolloutConfig
from rlvr.data import RLHFDataset
from rlvr.data.chat_template import ChatFormat
from rlvr.data.dataset import collate
from rlvr.models import load_model
from rlvr.rewards import RewardManager
from rlvr.rollout import MultiTurnRollout, RequestState
from rlvr.rollout.multi_turn import Request, truncate_text
from rlvr.tools import BaseTool, CalculatorTool, CallSlots, ToolError, function_tool
from rlvr.trainer.metrics import multi_turn_metrics
from rlvr.workers.forward import forward_log_probs
from tests.processes import alive_descendants

QUESTION = [{"role": "user", "content": "What is 12 * 34?"}]
CALL = "<calculator>12 * 34</calculator>"
ANSWER = "The answer is 408.<|im_end|>"


class Recorder(BaseTool):
    """Counts lifecycle calls, tracks concurrency, and rewards each trajectory by its calls."""

    def __init__(self, sleep=0.0, fail=None):
        super().__init__({}, None)
        self.sleep, self.fail = sleep, fail
        self.created, self.released, self.in_flight, self.peak = [], [], 0, 0
        self.calls: dict[str, int] = {}

    @classmethod
    def default_schema(cls):
        from rlvr.tools import OpenAIFunctionToolSchema
        return OpenAIFunctionToolSchema.from_dict({"type": "function", "function": {
            "name": "echo", "description": "Echo a number.",
            "parameters": {"type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"]}}})

    async def create(self, instance_id=None, **kw):
        self.created.append((instance_id, kw))
        return await super().create(instance_id, **kw)

    async def execute(self, instance_id, parameters, **kw):
        self.in_flight += 1
        self.peak = max(self.peak, self.in_flight)
        try:
            await asyncio.sleep(self.sleep)
            if self.fail == "raise":
                raise RuntimeError("boom")
            if self.fail == "hang":
                await asyncio.sleep(60)
            if self.fail == "own_timeout":  # the tool's own deadline (a socket's, a client's) ran out
                raise TimeoutError("the upstream service did not answer")
            self.calls[instance_id] = self.calls.get(instance_id, 0) + 1
            return f"echo {parameters['x']}", 0.25, {}
        finally:
            self.in_flight -= 1

    async def calc_reward(self, instance_id, **kw):
        return float(self.calls.get(instance_id, 0))

    async def release(self, instance_id, **kw):
        self.released.append(instance_id)
        await super().release(instance_id, **kw)


@pytest.fixture(scope="module")
def tiny(tiny_model_dir, tokenizer):
    return load_model(tiny_model_dir, "float32", "cpu"), tokenizer


def make_rollout(tiny, teacher_forced_engine, script, tools=None, fmt="tag", max_len=64, **mt):
    model, tokenizer = tiny
    tools = tools or {"calculator": CalculatorTool(None, None)}
    config = MultiTurnConfig(enable=True, tool_config_path="unused.yaml", format=fmt, **mt)
    chat = ChatFormat(tokenizer, [t.tool_schema.to_dict() for t in tools.values()], fmt)
    engine = teacher_forced_engine(script)(model, tokenizer, RolloutConfig(), max_len)
    return MultiTurnRollout(engine, tools, config, chat, max_len), chat


def prompts_for(rollout, chat, n=1, rows=None, tools_kwargs=None):
    rows = rows or [QUESTION]
    items = []
    for i, messages in enumerate(rows):
        items.append({"raw_prompt_ids": chat.prompt_ids(messages), "raw_prompt": messages,
                      "tools_kwargs": tools_kwargs or {}, "data_source": "arithmetic", "uid": f"u{i}"})
    batch = collate(items, rollout.engine.pad_id).repeat(n, interleave=True)
    batch.meta_info.update(seed=3)
    return batch


def with_prompt_keys(out, batch):
    """The rollout's output plus the prompt batch's non-tensor columns (uid, data_source, ...)."""
    for key, value in batch.non_tensor_batch.items():
        out.non_tensor_batch.setdefault(key, value)
    return out


def two_turn_script(context):
    """Call the calculator first, answer once the result is in the conversation."""
    if "<|im_start|>tool" not in context:
        return CALL
    return ANSWER if "408" in context else None


def test_call_then_answer_has_exact_tokens_masks_and_log_probs(tiny, tokenizer, teacher_forced_engine):
    rollout, chat = make_rollout(tiny, teacher_forced_engine, two_turn_script)
    batch = prompts_for(rollout, chat, n=2)
    out = rollout.generate_sequences(batch)
    call_ids = tokenizer.encode(CALL, add_special_tokens=False)
    answer_ids = tokenizer.encode(ANSWER, add_special_tokens=False)
    delta = chat.tool_delta([{"role": "tool", "content": "408"}])  # "<|im_end|>\n<|im_start|>tool\n408<|im_end|>\n<|im_start|>assistant\n"
    expected = call_ids + delta + answer_ids
    for row in range(2):
        n = int(out.batch["attention_mask"][row, -out.batch["responses"].shape[1]:].sum())
        assert out.batch["responses"][row, :n].tolist() == expected
        mask = out.batch["response_mask"][row, :n].tolist()
        assert mask == [1] * len(call_ids) + [0] * len(delta) + [1] * len(answer_ids)
        assert out.batch["rollout_log_probs"][row, len(call_ids):len(call_ids) + len(delta)].abs().sum() == 0
    assert list(out.non_tensor_batch["num_turns"]) == [4, 4]  # prompt, call, tool answer, final turn
    assert out.non_tensor_batch["finish_reason"][0] == "stop"
    messages = out.non_tensor_batch["messages"][0]
    assert [m["role"] for m in messages] == ["assistant", "tool", "assistant"]  # the turns after the prompt
    assert messages[1]["content"] == "408" and messages[0]["content"] == CALL
    counters = out.non_tensor_batch["multi_turn_metrics"][0]
    assert counters["tool_calls"] == 1 and counters["tool_calls/calculator"] == 1
    assert counters["tokenization_mismatch"] == 0
    # the training forward (both layouts) gives the rollout's log-probs at the model's tokens
    batch = with_prompt_keys(out, batch)
    for share in (True, False):
        lp, _ = forward_log_probs(tiny[0], batch.batch, list(batch.non_tensor_batch["uid"]), temperature=1.0,
                                  share_prompt=share, pad_id=rollout.engine.pad_id)
        model_tokens = batch.batch["response_mask"].bool()
        torch.testing.assert_close(lp[model_tokens], batch.batch["rollout_log_probs"][model_tokens], atol=2e-5, rtol=0)


def test_engine_sampled_turn_after_a_tool_result_aligns_with_training(tiny, teacher_forced_engine):
    """The second turn is sampled by the real engine over a context holding tool tokens."""
    script = lambda ctx: CALL if "<|im_start|>tool" not in ctx else None  # noqa: E731
    rollout, chat = make_rollout(tiny, teacher_forced_engine, script, max_len=40, max_assistant_turns=2)
    batch = prompts_for(rollout, chat, n=3)
    batch = with_prompt_keys(rollout.generate_sequences(batch), batch)
    mask = batch.batch["response_mask"].bool()
    call_len = len(tiny[1].encode(CALL, add_special_tokens=False))
    assert mask[:, call_len:].any()  # the engine sampled after the tool's tokens
    lp, _ = forward_log_probs(tiny[0], batch.batch, list(batch.non_tensor_batch["uid"]), 1.0, pad_id=rollout.engine.pad_id)
    torch.testing.assert_close(lp[mask], batch.batch["rollout_log_probs"][mask], atol=2e-5, rtol=0)


def test_reward_goes_on_the_last_model_token_and_sees_tool_rewards(tiny, teacher_forced_engine, tmp_path):
    script = lambda ctx: "<echo>5</echo>" if "<|im_start|>tool" not in ctx else None  # noqa: E731
    recorder = Recorder()
    rollout, chat = make_rollout(tiny, teacher_forced_engine, script, tools={"echo": recorder}, max_len=48,
                                 max_assistant_turns=2)
    batch = prompts_for(rollout, chat, n=2, tools_kwargs={"echo": {"create_kwargs": {"seed": 1}}})
    out = with_prompt_keys(rollout.generate_sequences(batch), batch)
    fn = tmp_path / "r.py"
    fn.write_text("def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
                  "    tr = extra_info['tool_rewards']\n"
                  "    return tr['final']['echo'] + sum(tr['steps']) + 10 * extra_info['num_turns']\n")
    from rlvr.config.schema import CustomRewardFunctionConfig, RewardConfig
    reward = RewardManager(tiny[1], RewardConfig(custom_reward_function=CustomRewardFunctionConfig(path=str(fn))))
    result = reward(out)
    # one echo call: calc_reward 1.0 + step reward 0.25 + 10 * 4 turns (verl's: the prompt, the call, its
    # answer, the model's turn after it)
    assert result.token_level_scores.sum(-1).tolist() == [41.25, 41.25]
    mask = out.batch["response_mask"]
    last_model = [int(torch.nonzero(m).max()) for m in mask]
    assert [int(torch.nonzero(s).max()) for s in result.token_level_scores] == last_model
    # lifecycle: one create per trajectory with its kwargs, one release each
    assert len(recorder.created) == 2 and all(kw == {"seed": 1} for _, kw in recorder.created)
    assert sorted(recorder.released) == sorted(i for i, _ in recorder.created)


@pytest.mark.parametrize("turn,counter,message", [
    ("<tool_call>{not json}</tool_call>", "invalid_json", "not valid JSON"),
    ('<tool_call>{"name": "nope", "arguments": {}}</tool_call>', "unknown_tool", "no tool named 'nope'"),
    ('<tool_call>{"name": "echo", "arguments": {"x": "five"}}</tool_call>', "invalid_arguments",
     "argument 'x' must be of type integer"),
])
def test_bad_calls_become_error_messages_and_counters(tiny, teacher_forced_engine, turn, counter, message):
    script = lambda ctx: turn if "<|im_start|>tool" not in ctx else None  # noqa: E731
    rollout, chat = make_rollout(tiny, teacher_forced_engine, script, tools={"echo": Recorder()}, fmt="hermes",
                                 max_len=48, max_assistant_turns=2)
    out = rollout.generate_sequences(prompts_for(rollout, chat))
    assert out.non_tensor_batch["multi_turn_metrics"][0][counter] == 1
    assert message in out.non_tensor_batch["messages"][0][1]["content"]


@pytest.mark.parametrize("fail,counter", [("raise", "tool_errors"), ("hang", "tool_timeouts"),
                                          ("own_timeout", "tool_errors")])  # not the rollout's timeout
def test_a_tool_that_raises_or_hangs_is_an_error_not_a_crash(tiny, teacher_forced_engine, fail, counter, capsys):
    script = lambda ctx: "<echo>1</echo>" if "<|im_start|>tool" not in ctx else None  # noqa: E731
    rollout, chat = make_rollout(tiny, teacher_forced_engine, script, tools={"echo": Recorder(fail=fail)},
                                 max_len=32, max_assistant_turns=2, tool_timeout_s=0.3)
    out = rollout.generate_sequences(prompts_for(rollout, chat, n=2))
    assert [c[counter] for c in out.non_tensor_batch["multi_turn_metrics"]] == [1, 1]
    assert out.non_tensor_batch["messages"][0][1]["content"].startswith("Error:")
    if fail == "raise":
        assert "tool 'echo' raised RuntimeError: boom" in capsys.readouterr().err
    if fail == "own_timeout":
        assert "the upstream service did not answer" in out.non_tensor_batch["messages"][0][1]["content"]
        assert [c.get("tool_timeouts", 0) for c in out.non_tensor_batch["multi_turn_metrics"]] == [0, 0]


class VerlStyle(Recorder):
    """verl's current tool API: create returns (instance_id, ToolResponse), execute a ToolResponse."""

    async def create(self, instance_id=None, **kw):
        from rlvr.tools.base import ToolResponse

        return await super().create(instance_id, **kw), ToolResponse()

    async def execute(self, instance_id, parameters, **kw):
        from rlvr.tools.base import ToolResponse

        text, reward, metrics = await super().execute(instance_id, parameters, **kw)
        return ToolResponse(text=text), reward, metrics


def test_a_verl_style_tool_runs(tiny, teacher_forced_engine):
    """verl's tools carry over: the instance id is create's first element (the tuple was used as
    the id, and every call failed with a KeyError), the answer ToolResponse's text."""
    script = lambda ctx: "<echo>5</echo>" if "<|im_start|>tool" not in ctx else None  # noqa: E731
    tool = VerlStyle()
    rollout, chat = make_rollout(tiny, teacher_forced_engine, script, tools={"echo": tool}, max_len=32,
                                 max_assistant_turns=2)
    out = rollout.generate_sequences(prompts_for(rollout, chat, n=2))
    assert [c.get("tool_errors", 0) for c in out.non_tensor_batch["multi_turn_metrics"]] == [0, 0]
    assert out.non_tensor_batch["messages"][0][1]["content"] == "echo 5"
    assert sorted(tool.calls.values()) == [1, 1] and all(isinstance(i, str) for i in tool.calls)


def test_calls_of_a_turn_run_concurrently_across_requests(tiny, teacher_forced_engine):
    recorder = Recorder(sleep=0.2)
    script = lambda ctx: "<echo>1</echo>" if "<|im_start|>tool" not in ctx else None  # noqa: E731
    rollout, chat = make_rollout(tiny, teacher_forced_engine, script, tools={"echo": recorder}, max_len=24,
                                 max_assistant_turns=2)
    rollout.generate_sequences(prompts_for(rollout, chat, n=6))
    assert recorder.peak == 6  # all six calls were in flight at once


class OneAtATime(Recorder):
    """A Recorder that runs one call at once; its execute takes the slot too, as the python tool's does."""

    def __init__(self, sleep):
        super().__init__(sleep=sleep)
        self.slots = CallSlots(1)

    def call_slot(self):
        return self.slots.hold()

    async def execute(self, instance_id, parameters, **kw):
        async with self.slots.hold():
            return await super().execute(instance_id, parameters, **kw)


def test_the_wait_for_a_tools_slot_is_not_counted_in_the_call_timeout(tiny, teacher_forced_engine):
    """Six calls of a tool that runs one at once, 0.25 s each, under tool_timeout_s = 1: the
    sixth waits 1.25 s for its slot. The timeout starts at the slot, so none times out; and the
    tool's own execute finds the slot already held by the rollout's call (a second slot, with
    the only one held by the rollout, would never come)."""
    tool = OneAtATime(sleep=0.25)
    script = lambda ctx: "<echo>1</echo>" if "<|im_start|>tool" not in ctx else None  # noqa: E731
    rollout, chat = make_rollout(tiny, teacher_forced_engine, script, tools={"echo": tool}, max_len=24,
                                 max_assistant_turns=2, tool_timeout_s=1.0)
    out = rollout.generate_sequences(prompts_for(rollout, chat, n=6))
    assert tool.peak == 1
    assert [c.get("tool_timeouts", 0) for c in out.non_tensor_batch["multi_turn_metrics"]] == [0] * 6
    assert [m[1]["content"] for m in out.non_tensor_batch["messages"]] == ["echo 1"] * 6


def test_calls_beyond_max_parallel_calls_are_dropped(tiny, teacher_forced_engine):
    recorder = Recorder()
    script = lambda ctx: "<echo>1</echo><echo>2</echo><echo>3</echo>" if "<|im_start|>tool" not in ctx else None  # noqa: E731
    rollout, chat = make_rollout(tiny, teacher_forced_engine, script, tools={"echo": recorder}, max_len=64,
                                 max_assistant_turns=2, max_parallel_calls=1)
    # (sampling stops at the first closing tag; a scripted turn holds three calls)
    out = rollout.generate_sequences(prompts_for(rollout, chat))
    counters = out.non_tensor_batch["multi_turn_metrics"][0]
    assert counters["tool_calls"] == 1 and counters["dropped_calls"] == 2
    assert [m["role"] for m in out.non_tensor_batch["messages"][0][:3]] == ["assistant", "tool", "assistant"]


def test_max_assistant_turns_ends_before_running_the_last_call(tiny, teacher_forced_engine):
    recorder = Recorder()
    rollout, chat = make_rollout(tiny, teacher_forced_engine, lambda ctx: "<echo>1</echo>", tools={"echo": recorder},
                                 max_len=64, max_assistant_turns=1)
    out = rollout.generate_sequences(prompts_for(rollout, chat))
    assert out.non_tensor_batch["finish_reason"][0] == "max_turns" and recorder.calls == {}
    assert int(out.batch["response_mask"].sum()) == int(out.batch["attention_mask"][:, -out.batch["responses"].shape[1]:].sum())


def test_response_budget_counts_tool_tokens(tiny, tokenizer, teacher_forced_engine):
    call = len(tokenizer.encode(CALL, add_special_tokens=False))
    delta = len(ChatFormat(tokenizer, [CalculatorTool(None, None).tool_schema.to_dict()], "tag")
                .tool_delta([{"role": "tool", "content": "408"}]))
    answer = len(tokenizer.encode(ANSWER, add_special_tokens=False))
    exact = call + delta + answer
    rollout, chat = make_rollout(tiny, teacher_forced_engine, two_turn_script, max_len=exact)
    out = rollout.generate_sequences(prompts_for(rollout, chat))
    assert out.non_tensor_batch["finish_reason"][0] == "stop"  # fits exactly: kept whole
    assert "truncated" not in out.non_tensor_batch["multi_turn_metrics"][0]
    rollout, chat = make_rollout(tiny, teacher_forced_engine, two_turn_script, max_len=call + 3)
    out = rollout.generate_sequences(prompts_for(rollout, chat))
    assert out.non_tensor_batch["finish_reason"][0] == "length"
    assert out.non_tensor_batch["multi_turn_metrics"][0]["truncated"] == 1
    assert out.batch["responses"].shape[1] == call + 3 and int(out.batch["response_mask"].sum()) == call


def test_request_state_machine_refuses_wrong_transitions():
    req = Request("r", list(QUESTION), [1, 2], 10)
    assert req.state is RequestState.PENDING
    with pytest.raises(RuntimeError, match="running from pending"):
        req.add_tool_responses([], [])  # a tool result before the request ran
    req.start()
    assert req.state is RequestState.RUNNING
    with pytest.raises(RuntimeError, match="expected pending"):
        req.start()


def test_truncate_tool_response_sides():
    text = "abcdefghijklmnopqrstuvwxyz" * 2
    # verl's tool_agent_loop: left keeps text[:n], right keeps text[-n:] (rlvr had the two swapped)
    assert truncate_text(text, 20, "left") == text[:6] + "...(truncated)"
    assert truncate_text(text, 20, "right") == "...(truncated)" + text[-6:]
    assert truncate_text(text, 20, "middle") == text[:3] + "...(truncated)" + text[-3:]
    assert truncate_text("short", 20, "middle") == "short"
    # a limit with no room for the marker still holds (it came back 14 characters long)
    assert [truncate_text(text, 5, side) for side in ("left", "right", "middle")] == [text[:5], text[-5:], text[:5]]


def test_multi_turn_metrics_aggregate_counters(tiny, teacher_forced_engine):
    rollout, chat = make_rollout(tiny, teacher_forced_engine, two_turn_script)
    batch = prompts_for(rollout, chat, n=2)
    out = rollout.generate_sequences(batch)
    metrics = multi_turn_metrics(out)
    assert metrics["num_turns/mean"] == 4 and metrics["multi_turn/tool_calls"] == 1
    assert metrics["multi_turn/tool_call_rate"] == 1.0 and metrics["multi_turn/tool_tokens/mean"] > 0


def test_tool_latency_is_per_call_a_tool_ran():
    """Malformed calls (no tool ran) do not halve the latency: 0.3 + 0.1 s over the 2 calls that
    ran is 0.2 s a call, not 0.1 s over all 4."""
    from rlvr.trainer.metrics import multi_turn_stats

    counters = [{"tool_calls": 2, "tool_runs": 1, "invalid_json": 1, "tool_latency_s": 0.3},
                {"tool_calls": 2, "tool_runs": 1, "unknown_tool": 1, "tool_latency_s": 0.1}]
    metrics = multi_turn_stats([2, 2], counters, [10, 10])
    assert metrics["multi_turn/tool_latency_s"] == pytest.approx(0.2)  # (0.3 + 0.1) / 2
    assert metrics["multi_turn/tool_calls"] == 2.0 and "multi_turn/tool_runs" not in metrics


def test_each_turn_reads_the_cache_the_last_turn_kept(tiny, teacher_forced_engine):
    """The loop calls the engine inside its turn_cache() (whose reuse of a kept turn is tested
    against a full prefill in test_engine.py), and nothing stays kept after the rollout."""
    model, tokenizer = tiny
    rollout, chat = make_rollout(tiny, teacher_forced_engine, lambda ctx: None, max_len=40, max_assistant_turns=2,
                                 schedule="turn")
    engine = rollout.engine
    seen = []
    generate = engine.generate

    def spy(prompts, params, groups=None, max_new_tokens=None):
        seen.append(engine._turns)
        return generate(prompts, params, groups, max_new_tokens)

    engine.generate = spy
    rollout.generate_sequences(prompts_for(rollout, chat, n=2))
    assert seen and all(seen) and not engine._turns and engine.core.keeping is None


class LatencyByArgument(Recorder):
    """An echo whose latency is its argument in tenths of a second; records when each call ended."""

    def __init__(self):
        super().__init__()
        self.ended: dict[int, float] = {}

    async def execute(self, instance_id, parameters, **kw):
        await asyncio.sleep(parameters["x"] / 10)
        self.ended[parameters["x"]] = time.perf_counter()
        return f"echo {parameters['x']}", 0.0, {}


SLOW_OR_FAST = [[{"role": "user", "content": "slow"}], [{"role": "user", "content": "fast"}]]


def slow_or_fast_script(context):
    """The first turn calls echo 6 (0.6 s) on the slow prompt, echo 0 on the fast one; the turn
    after the tool's answer is the model's own (sampled)."""
    if "<|im_start|>tool" in context:
        return None
    return "<echo>6</echo>" if "slow" in context else "<echo>0</echo>"


@pytest.mark.parametrize("schedule", ["request", "turn"])
def test_a_request_whose_tool_answered_moves_on_while_another_tool_runs(tiny, teacher_forced_engine, schedule):
    """schedule=request: the fast prompt's requests send their second turn to the engine while the
    slow prompt's tool is still running (each request is its own coroutine on the engine core);
    schedule=turn: every second turn waits for the turn's slowest call."""
    tool = LatencyByArgument()
    rollout, chat = make_rollout(tiny, teacher_forced_engine, slow_or_fast_script, tools={"echo": tool}, max_len=40,
                                 max_assistant_turns=2, schedule=schedule)
    second_turns = []
    if schedule == "request":
        session = rollout.engine.session

        def spying_session():
            inner = session()

            class Spy:
                def __getattr__(self, name):
                    return getattr(inner, name)

                async def generate(self, prompt, params, **where):
                    if "<|im_start|>tool" in tiny[1].decode(prompt):
                        second_turns.append(("fast" in tiny[1].decode(prompt), time.perf_counter()))
                    return await inner.generate(prompt, params, **where)

            return Spy()

        rollout.engine.session = spying_session
    else:
        generate = rollout.engine.generate

        def spying_generate(prompts, params, groups=None, max_new_tokens=None):
            now = time.perf_counter()
            second_turns.extend(("fast" in tiny[1].decode(p), now) for p in prompts if "<|im_start|>tool" in tiny[1].decode(p))
            return generate(prompts, params, groups, max_new_tokens)

        rollout.engine.generate = spying_generate
    out = rollout.generate_sequences(prompts_for(rollout, chat, n=2, rows=SLOW_OR_FAST))
    assert list(out.non_tensor_batch["num_turns"]) == [4, 4, 4, 4]
    fast_done = [t for fast, t in second_turns if fast]  # when each second turn reached the engine
    assert len(fast_done) == 2 and len(second_turns) == 4
    if schedule == "request":
        assert max(fast_done) < tool.ended[6]  # submitted to the engine before the slow call answered
    else:
        assert min(fast_done) > tool.ended[6]


def test_the_request_schedule_samples_what_the_turn_schedule_samples(tiny, teacher_forced_engine):
    """The same batch under both schedules: the same tokens, masks and turns (each request's k-th
    turn draws the uniforms of its row with the seed + 7919 k either way), log-probs equal to the
    last bits a different decode batch moves; turns the model samples itself after a tool's
    answer, and a prompt that calls no tool. The kept turns are used (a second turn prefills only
    the tool's tokens) and none is left after the rollout."""
    def script(context):
        if "nothing" in context or "<|im_start|>tool" in context:
            return None  # the model's own turn
        return CALL

    rows = [QUESTION, [{"role": "user", "content": "say nothing"}]]
    outs = {}
    for schedule in ("turn", "request"):
        rollout, chat = make_rollout(tiny, teacher_forced_engine, script, max_len=48, max_assistant_turns=3,
                                     schedule=schedule)
        before = dict(rollout.engine.prefill_tokens)
        outs[schedule] = rollout.generate_sequences(prompts_for(rollout, chat, n=3, rows=rows))
        reused = rollout.engine.prefill_tokens["reused"] - before["reused"]
        assert reused > 0 and rollout.engine.core.kept == [] and rollout.engine.core.keeping is None
    a, b = outs["turn"], outs["request"]
    assert torch.equal(a.batch["responses"], b.batch["responses"])
    assert torch.equal(a.batch["response_mask"], b.batch["response_mask"])
    assert torch.allclose(a.batch["rollout_log_probs"], b.batch["rollout_log_probs"], atol=1e-5)
    assert list(a.non_tensor_batch["num_turns"]) == list(b.non_tensor_batch["num_turns"])
    assert list(a.non_tensor_batch["finish_reason"]) == list(b.non_tensor_batch["finish_reason"])
    assert int(b.batch["response_mask"][:3].sum()) > len(tiny[1].encode(CALL, add_special_tokens=False)) * 3  # sampled turns too
    assert min(b.non_tensor_batch["num_turns"][:3]) >= 4  # prompt, the call, its answer, the model's turn after


def test_engine_caps_each_row_at_its_own_budget(tiny):
    """Requests with different budgets left share one decode batch; each stops at its own."""
    from rlvr.rollout import NativeRollout
    from rlvr.rollout.sampling import SamplingParams

    engine = NativeRollout(*tiny, RolloutConfig(), 16)
    prompt = tiny[1].encode("Count to ten:", add_special_tokens=False)
    params = SamplingParams(max_new_tokens=16, seed=0)
    free = engine.generate([prompt] * 3, params, groups=["a"] * 3)
    capped = engine.generate([prompt] * 3, params, groups=["a"] * 3, max_new_tokens=[2, 5, 16])
    for c, f, budget in zip(capped, free, [2, 5, 16]):
        assert c.token_ids == f.token_ids[:budget]  # same draws, cut at the row's budget
        assert c.finish_reason == ("length" if len(f.token_ids) > budget else f.finish_reason)


@function_tool
def echo_text(text: str) -> str:
    """Echo a text."""
    return text


def test_a_failure_while_handling_one_request_fails_that_request_only(tiny, tokenizer, teacher_forced_engine, capsys):
    """A model that writes the JSON escape of a lone surrogate gets it echoed back; the tokenizer
    cannot encode that text. Its request fails; the other request and the step go on."""
    bad = '<tool_call>{"name": "echo_text", "arguments": {"text": "\\udc80"}}</tool_call>'  # the escape as text
    good = '<tool_call>{"name": "echo_text", "arguments": {"text": "442"}}</tool_call>'

    def script(ctx):
        if "<|im_start|>tool" in ctx:
            return "Done.<|im_end|>"
        return bad if "12 * 34" in ctx else good

    recorder = Recorder()
    rollout, chat = make_rollout(tiny, teacher_forced_engine, script, tools={"echo_text": echo_text, "echo": recorder},
                                 fmt="hermes", max_len=64, max_assistant_turns=2)
    out = rollout.generate_sequences(prompts_for(rollout, chat, rows=[QUESTION, [{"role": "user", "content": "13 * 34?"}]]))
    assert list(out.non_tensor_batch["finish_reason"]) == ["failed", "stop"]
    counters = out.non_tensor_batch["multi_turn_metrics"]
    assert counters[0]["failed"] == 1 and "failed" not in counters[1]
    assert [m["role"] for m in out.non_tensor_batch["messages"][0]] == ["assistant"]  # the bad result never entered
    assert out.non_tensor_batch["messages"][1][1]["content"] == "442"
    assert int(out.batch["response_mask"][0].sum()) == 0  # a failed trajectory is not trained on
    good_ids, done_ids = (tokenizer.encode(t, add_special_tokens=False) for t in (good, "Done.<|im_end|>"))
    assert int(out.batch["response_mask"][1].sum()) == len(good_ids) + len(done_ids)
    assert sorted(recorder.released) == sorted(i for i, _ in recorder.created)  # both trajectories released
    assert "request u0-0: appending its tool results failed: ValueError: tool output '\\udc80' is not valid Unicode " \
           "text (surrogates not allowed at character 0)" in capsys.readouterr().err


class BadReward(Recorder):
    async def calc_reward(self, instance_id, **kw):
        raise RuntimeError("no reward")


def test_release_runs_when_calc_reward_raises(tiny, teacher_forced_engine):
    tool = BadReward()
    script = lambda ctx: "<echo>1</echo>" if "<|im_start|>tool" not in ctx else None  # noqa: E731
    rollout, chat = make_rollout(tiny, teacher_forced_engine, script, tools={"echo": tool}, max_len=24,
                                 max_assistant_turns=2)
    out = rollout.generate_sequences(prompts_for(rollout, chat, n=3))
    assert len(tool.created) == 3 and sorted(tool.released) == sorted(i for i, _ in tool.created)
    assert [c["tool_errors"] for c in out.non_tensor_batch["multi_turn_metrics"]] == [1, 1, 1]
    assert [r["final"] for r in out.non_tensor_batch["tool_rewards"]] == [{}, {}, {}]  # left out, not 0


class Stuck(Recorder):
    """Calls that wait until cancelled; each records that its cleanup ran."""

    def __init__(self):
        super().__init__()
        self.cleaned, self.started = 0, threading.Event()

    async def execute(self, instance_id, parameters, **kw):
        self.in_flight += 1
        if self.in_flight == 2:
            self.started.set()
        try:
            await asyncio.sleep(60)
        finally:
            self.in_flight -= 1
            self.cleaned += 1


def test_ctrl_c_mid_tool_turn_cancels_and_drains_the_calls_and_releases(tiny, teacher_forced_engine, ctrl_c_raises):
    tool = Stuck()
    rollout, chat = make_rollout(tiny, teacher_forced_engine, lambda ctx: "<echo>1</echo>", tools={"echo": tool},
                                 max_len=24, max_assistant_turns=2)
    batch = prompts_for(rollout, chat, n=2)

    def interrupt():
        if tool.started.wait(30):
            os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C while both calls are in flight

    threading.Thread(target=interrupt, daemon=True).start()
    with pytest.raises(KeyboardInterrupt):
        rollout.generate_sequences(batch)
    assert tool.cleaned == 2 and tool.in_flight == 0  # both calls were cancelled and awaited
    assert len(tool.created) == 2 and sorted(tool.released) == sorted(i for i, _ in tool.created)


def test_ctrl_c_in_a_decode_step_of_the_request_schedule_releases_every_tool(tiny, teacher_forced_engine):
    """schedule=request: a KeyboardInterrupt raised inside the engine core's step (one request's
    second turn decoding while the other's tool is still running) ends the rollout with it, the
    running call cancelled and awaited, every tool instance released, and nothing left in the core."""
    tool = LatencyByArgument()
    rollout, chat = make_rollout(tiny, teacher_forced_engine, slow_or_fast_script, tools={"echo": tool}, max_len=40,
                                 max_assistant_turns=2)
    core = rollout.engine.core
    step, steps = core.step, []

    def interrupting_step():
        steps.append(len(core.running))
        if core.running and "<|im_start|>tool" in tiny[1].decode(core.running[0].request.prompt_ids):
            raise KeyboardInterrupt  # Ctrl-C in a second turn's decode step
        return step()

    core.step = interrupting_step
    with pytest.raises(KeyboardInterrupt):
        rollout.generate_sequences(prompts_for(rollout, chat, n=2, rows=SLOW_OR_FAST))
    assert 6 not in tool.ended  # the slow call did not finish: it was cancelled
    assert len(tool.created) == 4 and sorted(tool.released) == sorted(i for i, _ in tool.created)
    assert not core.running and not core.waiting and core.kept == [] and core.keeping is None


def test_a_requests_samples_do_not_depend_on_which_others_still_run(tiny, teacher_forced_engine):
    """Rows 2-3 (12 * 34) call the calculator, then sample their second turn. Rows 0-1 (13 * 34)
    either call it too (all four sample turn 2) or answer at once (rows 2-3 sample alone). The
    contexts of rows 2-3 are the same token for token (442 and 408 have as many digits), so
    their sampled turn must be too."""
    q13 = [{"role": "user", "content": "What is 13 * 34?"}]

    def script(all_call):
        def turn(ctx):
            if "<|im_start|>tool" in ctx:
                return None  # sampled by the engine
            if "13 * 34" in ctx and not all_call:
                return ANSWER
            return "<calculator>13 * 34</calculator>" if "13 * 34" in ctx else CALL
        return turn

    sampled = []
    for all_call in (True, False):
        rollout, chat = make_rollout(tiny, teacher_forced_engine, script(all_call), max_len=40, max_assistant_turns=2)
        out = rollout.generate_sequences(prompts_for(rollout, chat, n=2, rows=[q13, QUESTION]))
        assert list(out.non_tensor_batch["num_turns"]) == ([4, 4, 4, 4] if all_call else [2, 2, 4, 4])
        sampled.append(out.batch["responses"][2:].tolist())
    assert sampled[0] == sampled[1]


def test_a_stuck_sync_tool_refuses_new_calls_and_counts_them(tiny, teacher_forced_engine):
    release = threading.Event()

    def wait(x: int) -> str:
        """Wait for the test."""
        release.wait()
        return str(x)

    from rlvr.tools import FunctionTool

    tool = FunctionTool(wait, {"max_stuck_calls": 2}, name="echo")
    script = lambda ctx: "<echo>1</echo>" if "<|im_start|>tool" not in ctx else None  # noqa: E731
    rollout, chat = make_rollout(tiny, teacher_forced_engine, script, tools={"echo": tool}, max_len=24,
                                 max_assistant_turns=2, tool_timeout_s=0.2)
    try:
        first = rollout.generate_sequences(prompts_for(rollout, chat, n=2))
        second = rollout.generate_sequences(prompts_for(rollout, chat, n=2))
    finally:
        release.set()
    # step 1: both calls start (none stuck yet) and time out: 2 stuck; step 2: both refused at once
    assert [c["tool_timeouts"] for c in first.non_tensor_batch["multi_turn_metrics"]] == [1, 1]
    assert [(c["tool_busy"], c["tool_errors"], c.get("tool_timeouts", 0))
            for c in second.non_tensor_batch["multi_turn_metrics"]] == [(1, 1, 0), (1, 1, 0)]
    assert second.non_tensor_batch["messages"][0][1]["content"].startswith("Error: echo has 2 earlier calls")


def test_ctrl_c_mid_python_call_leaves_no_sandbox_behind(tiny, teacher_forced_engine, tmp_path, ctrl_c_raises):
    """The issue's report: Ctrl-C inside a tool turn left the sandbox running with ppid 1 and
    its folder behind, because the loop closed without cancelling the call."""
    from pathlib import Path

    from rlvr.tools.python import MOUNT_PREFIX, PythonTool, sandbox_error

    why = sandbox_error()
    if why is not None:
        pytest.skip(why)
    tool = PythonTool({"timeout_s": 60, "cpu_time_s": 60}, None)
    rollout, chat = make_rollout(tiny, teacher_forced_engine, lambda ctx: "<python>import time; time.sleep(60)</python>",
                                 tools={"python": tool}, max_len=32, max_assistant_turns=2, tool_timeout_s=60)
    batch = prompts_for(rollout, chat)
    seen: list[int] = []
    earlier = set(alive_descendants(os.getpid()))  # e.g. a reward pool an earlier test started

    def interrupt():
        deadline = time.monotonic() + 30
        while len(seen) < 2 and time.monotonic() < deadline:  # the launcher and the sandboxed interpreter
            seen[:] = [p for p in alive_descendants(os.getpid()) if p not in earlier]
            time.sleep(0.05)
        os.kill(os.getpid(), signal.SIGINT)

    threading.Thread(target=interrupt, daemon=True).start()
    with pytest.raises(KeyboardInterrupt):
        rollout.generate_sequences(batch)
    assert len(seen) >= 2
    deadline = time.monotonic() + 10
    while set(seen) & set(alive_descendants(os.getpid())) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert set(seen) & set(alive_descendants(os.getpid())) == set()
    assert list(Path(tempfile.gettempdir()).glob(f"{MOUNT_PREFIX}{os.getpid()}-*")) == []


def test_the_tool_loops_format_renders_with_the_datas_template_kwargs(tokenizer):
    """data.apply_chat_template_kwargs reach the tool loop's format however it is built: the trainer's
    ToolSetup, and the one a worker process builds from the rollout config (build_rollout's fallback);
    a format without them would render every turn after a tool result unlike the dataset's prompts."""
    from rlvr.rollout import ToolSetup, build_rollout

    config = RolloutConfig(multi_turn=MultiTurnConfig(enable=True, tool_config_path="calculator", format="tag"))
    kwargs = {"enable_thinking": False}
    assert ToolSetup.from_config(tokenizer, config, kwargs).chat.template_kwargs == kwargs
    model = load_model("builtin", "float32")
    rollout = build_rollout(model, tokenizer, config, 8, template_kwargs=kwargs)
    assert rollout.chat.template_kwargs == kwargs
    assert build_rollout(model, tokenizer, config, 8).chat.template_kwargs == {}


class Answers(Recorder):
    """A tool whose execute returns ``result`` as it is (a contract test: what reaches the model)."""

    def __init__(self, result):
        super().__init__()
        self.result = result

    async def execute(self, instance_id, parameters, **kw):
        return self.result


def shown_after_one_echo_call(tiny, teacher_forced_engine, tool):
    script = lambda ctx: "<echo>1</echo>" if "<|im_start|>tool" not in ctx else None  # noqa: E731
    rollout, chat = make_rollout(tiny, teacher_forced_engine, script, tools={"echo": tool}, max_len=32,
                                 max_assistant_turns=2)
    out = rollout.generate_sequences(prompts_for(rollout, chat))
    return out.non_tensor_batch["messages"][0][1]["content"], out.non_tensor_batch["multi_turn_metrics"][0]


@pytest.mark.parametrize("text,shown", [
    (0, "0"),  # a falsy answer is still an answer (it was shown as "")
    (False, "False"),
    ("caf\u00e9".encode(), "caf\u00e9"),  # bytes are UTF-8 text (they were shown as "b'caf\\xc3\\xa9'")
    (None, ""),  # verl's ToolResponse(text=None): no text
])
def test_a_tools_answer_reaches_the_model_as_its_text(tiny, teacher_forced_engine, text, shown):
    content, counters = shown_after_one_echo_call(tiny, teacher_forced_engine, Answers((text, 0.0, {})))
    assert content == shown and "tool_errors" not in counters


@pytest.mark.parametrize("result", ["408", ("408", 0.5), ("408", "high", {})])
def test_an_execute_result_not_text_reward_metrics_is_a_tool_error_naming_the_contract(
        tiny, teacher_forced_engine, result, capsys):
    """A plain "408" was unpacked as three characters: the model was shown "4" with no error."""
    content, counters = shown_after_one_echo_call(tiny, teacher_forced_engine, Answers(result))
    assert content.startswith("Error:") and counters["tool_errors"] == 1
    assert "(text, reward, metrics)" in capsys.readouterr().err


def test_a_tool_that_calls_sys_exit_is_a_tool_error_not_the_end_of_the_run(tiny, teacher_forced_engine, capsys):
    """A function tool that wraps a command line (argparse exits on bad arguments) raised
    SystemExit through the rollout: the trainer ended with status 2 and no traceback."""
    @function_tool
    def cli(x: int) -> str:
        """Run a command line."""
        raise SystemExit(2)

    script = lambda ctx: "<cli>1</cli>" if "<|im_start|>tool" not in ctx else None  # noqa: E731
    rollout, chat = make_rollout(tiny, teacher_forced_engine, script, tools={"cli": cli}, max_len=32,
                                 max_assistant_turns=2)
    out = rollout.generate_sequences(prompts_for(rollout, chat, n=2))
    assert [c["tool_errors"] for c in out.non_tensor_batch["multi_turn_metrics"]] == [1, 1]
    assert out.non_tensor_batch["messages"][0][1]["content"] == "Error: cli failed: SystemExit: 2"
    assert "tool 'cli' raised SystemExit" in capsys.readouterr().err


class SyncExecute(Recorder):
    def execute(self, instance_id, parameters, **kw):  # not async: `await` on its tuple fails every call
        return "sync", 0.0, {}


def test_a_tool_whose_methods_are_not_coroutines_is_refused_when_the_loop_is_built(tiny, teacher_forced_engine):
    """It was built, and every call of the run became "Error: ... object tuple can't be used in
    'await' expression" (one warning, training went on)."""
    with pytest.raises(TypeError, match=r"tool 'echo' \(SyncExecute\): execute is not a coroutine function"):
        make_rollout(tiny, teacher_forced_engine, lambda ctx: None, tools={"echo": SyncExecute()})
