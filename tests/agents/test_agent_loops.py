"""Agent loops (verl's AgentLoopBase API) on the in-process engine: the single-turn loop through
the agent path equals the batch rollout bit for bit; a two-turn loop's trajectory is exactly
the engine's sampled tokens around the tokens it added (mask 0), reproducible whatever its
I/O's timing; loops learn; a loop config file registers loops by _target_; broken loops and
unknown names are refused naming the loop and the row."""

import json

import pytest
import torch

from rlvr.config import ConfigError
from rlvr.trainer.main import build_trainer
from tests.agents import loops
from tests.agents.loops import NUDGE  # and registers echo_single, long_and_short
from tests.trainer.conftest import tiny_config, tiny_data  # noqa: F401 (fixtures)
from tests.trainer.test_learning import LEADING_SPACE, LEARN, records_of, train

LOOPS_YAML = """
- name: two_turn
  _target_: tests.agents.loops.TwoTurnLoop
- name: broken
  _target_: tests.agents.loops.Broken
- name: splits
  _target_: tests.agents.loops.SplitLoop
"""
QUIET = ("trainer.val_before_train=false", "trainer.test_freq=-1", "trainer.freshness_check_freq=-1")


@pytest.fixture
def loops_file(tmp_path):
    path = tmp_path / "agent_loops.yaml"
    path.write_text(LOOPS_YAML)
    return path


def rollout_of(tiny_config, *overrides):
    trainer = build_trainer(tiny_config(*QUIET, *overrides), progress_bar=False)
    batch = next(iter(trainer._batches()))[0]
    return trainer, batch


def generate(trainer, batch, step=1):
    batch, gen = trainer._dispatch(batch, step, 0)
    return batch, trainer.rollout_wg.generate_sequences(gen)


def test_the_single_turn_loop_through_the_agent_path_equals_the_batch_rollout(tiny_config):
    """default_agent_loop=echo_single (the built-in SingleTurnAgentLoop registered again) runs every
    row as a coroutine over the engine: responses, masks and log-probs equal the batch rollout's."""
    _, a = generate(*rollout_of(tiny_config))  # one trainer at a time: each sets torch's thread count
    looped, batch = rollout_of(tiny_config, "actor_rollout_ref.rollout.agent.default_agent_loop=echo_single")
    assert type(looped.wg.worker.rollout).__name__ == "AgentLoopRollout"
    _, b = generate(looped, batch)
    for key in ("responses", "response_mask", "rollout_log_probs", "input_ids", "attention_mask"):
        assert torch.equal(a.batch[key], b.batch[key]), key
    assert int(a.batch["response_mask"].sum()) > 0


def test_a_two_turn_loop_keeps_the_engines_tokens_and_masks_what_it_added(tiny_config, loops_file):
    """Each row: turn 1's sampled tokens, NUDGE (mask 0, log-prob 0), turn 2's sampled tokens, as
    the engine returned them (the loop's extra fields carry each turn's ids): nothing re-tokenised.
    Odd rows sleep before turn 2, so turns 2 reach the engine in several rounds; a second run
    samples the same tokens (each call draws from its row and call index, not its round)."""
    overrides = (f"actor_rollout_ref.rollout.agent.agent_loop_config_path={loops_file}",
                 "actor_rollout_ref.rollout.agent.default_agent_loop=two_turn", "data.max_response_length=24")
    runs = []
    for _ in range(2):
        trainer, batch = rollout_of(tiny_config, *overrides)
        _, out = generate(trainer, batch)
        runs.append(out)
    out = runs[0]
    for r in range(len(out)):
        first, second = out.non_tensor_batch["first_ids"][r], out.non_tensor_batch["second_ids"][r]
        n = len(first) + len(NUDGE) + len(second)
        assert out.batch["responses"][r, :n].tolist() == first + NUDGE + second
        assert out.batch["response_mask"][r, :n].tolist() == [1] * len(first) + [0, 0] + [1] * len(second)
        assert out.batch["rollout_log_probs"][r, len(first):len(first) + 2].tolist() == [0.0, 0.0]
        assert int(out.batch["response_mask"][r, n:].sum()) == 0
    assert list(out.non_tensor_batch["num_turns"]) == [4] * len(out)
    assert out.meta_info["rollout_metrics"]["agent/calls"] == 2 * len(out)
    assert torch.equal(runs[0].batch["responses"], runs[1].batch["responses"])
    assert len({tuple(t) for t in out.non_tensor_batch["second_ids"]}) > 1  # rows sampled differently


def test_a_custom_loop_learns(tiny_config, tmp_path, loops_file):
    """GRPO through the two-turn loop on the leading-space task (the reward reads the whole
    response, so turn 1's first token decides it): reward rises as the batch rollout's does."""
    _, records = train(tiny_config, tmp_path, LEADING_SPACE, *LEARN, "actor_rollout_ref.actor.optim.lr=1e-1",
                       "trainer.total_training_steps=10", "trainer.freshness_check_freq=-1",
                       f"actor_rollout_ref.rollout.agent.agent_loop_config_path={loops_file}",
                       "actor_rollout_ref.rollout.agent.default_agent_loop=two_turn", "data.max_response_length=24")
    scores = [r["critic/score/mean"] for r in records]
    assert scores[0] < 0.8 and min(scores[-3:]) >= 0.9, scores
    assert all(r["agent/calls"] == 2 * 16 for r in records)  # two calls a row, 2 prompts x n = 8


@pytest.mark.parametrize("how, message", [
    ("raises", r"agent loop 'broken' raised on row 0: ValueError: the environment is down"),
    ("lengths", r"agent loop 'broken', row 0: response_ids \(\d+\), response_mask \(\d+\)"),
])
def test_a_broken_loop_is_named_with_its_row(tiny_config, loops_file, how, message):
    from rlvr.agents.rollout import AgentLoopError

    trainer, batch = rollout_of(tiny_config, f"actor_rollout_ref.rollout.agent.agent_loop_config_path={loops_file}",
                                "actor_rollout_ref.rollout.agent.default_agent_loop=broken",
                                f"trainer.experiment_name={how}")
    with pytest.raises(AgentLoopError, match=message):
        generate(trainer, batch)


def test_loop_names_and_files_are_checked_at_load(tiny_config, tmp_path, tiny_data):  # noqa: F811
    from rlvr.config import load_config

    with pytest.raises(ConfigError, match="default_agent_loop = 'nope' is not a registered agent loop"):
        tiny_config("actor_rollout_ref.rollout.agent.default_agent_loop=nope")
    bad = tmp_path / "bad.yaml"
    bad.write_text("- name: x\n  _target_: tests.agents.loops.Nowhere\n")
    with pytest.raises(ConfigError, match=r"bad.yaml: entry 0 \(x\): cannot import tests.agents.loops.Nowhere"):
        tiny_config(f"actor_rollout_ref.rollout.agent.agent_loop_config_path={bad}")
    with pytest.raises(ConfigError, match="default_agent_loop=tool_agent is the multi-turn tool loop"):
        load_config(overrides=["actor_rollout_ref.rollout.agent.default_agent_loop=tool_agent"])
    # a row whose agent_name names no loop this run can run: refused naming the file and row
    import pyarrow.parquet as pq

    table = pq.read_table(tiny_data["train"]).to_pylist()
    table[1]["agent_name"] = "unknown_agent"
    for row in table:
        row.setdefault("agent_name", None)
    named = tmp_path / "named.parquet"
    import pyarrow as pa
    pq.write_table(pa.Table.from_pylist(table), named)
    with pytest.raises(ConfigError, match=r"agent_name 'unknown_agent' is not a loop this run can run"):
        build_trainer(tiny_config(*QUIET, f"data.train_files=[{named}]"), progress_bar=False)


def test_a_loop_registered_in_a_custom_modules_file_runs_the_rows_that_name_it(tiny_config, tmp_path, tiny_data):  # noqa: F811
    """docs/agents.md: register a loop in a custom_modules file and the dataset's agent_name picks
    it, with no loop file and the default loop built in (it was refused at load)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    module = tmp_path / "my_loops.py"
    module.write_text("from rlvr.agents import SingleTurnAgentLoop, register\n\n\n"
                      "@register('from_custom_module')\n"
                      "class FromCustomModule(SingleTurnAgentLoop):\n"
                      "    async def run(self, sampling_params, **kwargs):\n"
                      "        out = await super().run(sampling_params, **kwargs)\n"
                      "        out.metrics = {'custom_ran': 1.0}\n"
                      "        return out\n")
    table = pq.read_table(tiny_data["train"]).to_pylist()
    for i, row in enumerate(table):
        row["agent_name"] = "from_custom_module" if i % 2 == 0 else None
    named = tmp_path / "named.parquet"
    pq.write_table(pa.Table.from_pylist(table), named)
    trainer, batch = rollout_of(tiny_config, f"custom_modules=[{module}]", f"data.train_files=[{named}]")
    _, out = generate(trainer, batch)
    ran = out.meta_info.get("rollout_metrics", {})
    assert ran.get("agent/custom_ran") == 0.5, ran  # the mean over the batch's rows: the half that name it


def test_openai_agent_needs_exactly_one_agent(tiny_config, tmp_path, tiny_data):  # noqa: F811
    """gateway.function and .command both set: refused (one silently won); a row naming
    openai_agent with neither: refused naming the row (every episode failed at run time)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    with pytest.raises(ConfigError, match="gateway.function and actor_rollout_ref.rollout.agent.gateway.command "
                                          "are both set"):
        tiny_config("actor_rollout_ref.rollout.agent.gateway.function=a.py:agent",
                    "actor_rollout_ref.rollout.agent.gateway.command=./agent")
    table = pq.read_table(tiny_data["train"]).to_pylist()
    for i, row in enumerate(table):
        row["agent_name"] = "openai_agent" if i == 2 else None
    named = tmp_path / "named.parquet"
    pq.write_table(pa.Table.from_pylist(table), named)
    with pytest.raises(ConfigError, match=r"named.parquet.*row 2.*agent_name openai_agent runs your agent"):
        build_trainer(tiny_config(*QUIET, f"data.train_files=[{named}]"), progress_bar=False)


@pytest.mark.parametrize("how", ["quarter", "nan"])
def test_a_loops_reward_score_is_its_rows_score_under_the_nan_guard(tiny_config, tmp_path, loops_file, how):
    """reward_score replaces the reward function's score (the leading-space function gives 0 or
    1, never 0.25); a NaN one is counted and its group left out, as a function's NaN is."""
    _, records = train(tiny_config, tmp_path, LEADING_SPACE, "trainer.total_training_steps=1",
                       "trainer.freshness_check_freq=-1", f"trainer.experiment_name={how}",
                       f"actor_rollout_ref.rollout.agent.agent_loop_config_path={loops_file}",
                       "actor_rollout_ref.rollout.agent.default_agent_loop=broken")
    if how == "quarter":
        assert records[0]["critic/score/mean"] == 0.25
    else:
        r = records[0]
        assert r["training/dropped_groups"] >= 1 and r["reward/num_invalid"] == 3 * r["training/dropped_groups"]  # n = 3


def test_agent_loops_run_on_rollout_servers(tiny_config, loops_file):
    """rollout.mode=async: the rounds go to an rlvr serve replica as requests; the two-turn loop's
    trajectory is still the tokens the server sampled around NUDGE, and each turn's tokens are
    the server's (its log-probs are the rollout's)."""
    trainer, batch = rollout_of(tiny_config, "actor_rollout_ref.rollout.mode=async",
                                f"actor_rollout_ref.rollout.agent.agent_loop_config_path={loops_file}",
                                "actor_rollout_ref.rollout.agent.default_agent_loop=two_turn", "data.max_response_length=24")
    try:
        assert type(trainer.wg.worker.rollout.engine).__name__ == "ServerRollout"
        _, out = generate(trainer, batch)
    finally:
        trainer.wg.shutdown()
    for r in range(len(out)):
        first, second = out.non_tensor_batch["first_ids"][r], out.non_tensor_batch["second_ids"][r]
        n = len(first) + len(NUDGE) + len(second)
        assert out.batch["responses"][r, :n].tolist() == first + NUDGE + second
        assert out.batch["response_mask"][r, :n].tolist() == [1] * len(first) + [0, 0] + [1] * len(second)
        assert float(out.batch["rollout_log_probs"][r, :len(first)].abs().sum()) > 0


def test_tool_agent_rows_share_a_batch_with_other_loops(tiny_config, tmp_path, tiny_data, loops_file):  # noqa: F811
    """agent_name per row: one prompt names tool_agent (the multi-turn loop), the other the
    two-turn loop. Each part's rows are what its rollout gives them alone, from rows of the whole
    batch of their own (the loops' rows 0-2, the tool rows 3-5), joined back in the batch's order with the
    columns of both (None where a part has none); a training step runs on the joined batch."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pq.read_table(tiny_data["train"]).to_pylist()
    for i, row in enumerate(table):
        row["agent_name"] = "tool_agent" if i % 2 == 0 else "two_turn"
    named = tmp_path / "named.parquet"
    pq.write_table(pa.Table.from_pylist(table), named)
    overrides = (f"data.train_files=[{named}]", "data.return_raw_chat=true", "data.max_response_length=24",
                 "data.max_prompt_length=512",
                 "actor_rollout_ref.rollout.multi_turn.enable=true",
                 "actor_rollout_ref.rollout.multi_turn.tool_config_path=calculator",
                 f"actor_rollout_ref.rollout.agent.agent_loop_config_path={loops_file}")
    trainer, batch = rollout_of(tiny_config, *overrides)
    batch, gen = trainer._dispatch(batch, 1, 0)
    out = trainer.rollout_wg.generate_sequences(gen)
    names = list(gen.non_tensor_batch["agent_name"])
    assert sorted(names) == ["tool_agent"] * 3 + ["two_turn"] * 3  # a prompt's n rows name its loop
    assert list(out.non_tensor_batch["agent_name"]) == names
    rollout = trainer.wg.worker.rollout
    tool_rows = [r for r, n in enumerate(names) if n == "tool_agent"]
    loop_rows = [r for r, n in enumerate(names) if n == "two_turn"]
    alone = {}
    for rows, start in ((loop_rows, 0), (tool_rows, 3)):
        sub = gen.select_idxs(rows)
        sub.meta_info = {**gen.meta_info, "row_offset": start, "total_rows": 6}
        if start:  # the tool rows: the multi-turn loop's
            sub.non_tensor_batch.pop("agent_name")
            alone[start] = rollout.fallback.generate_sequences(sub)
        else:
            alone[start] = rollout.generate_sequences(sub)
    for rows, part in ((loop_rows, alone[0]), (tool_rows, alone[3])):
        R = part.batch["responses"].shape[1]
        for j, r in enumerate(rows):
            assert out.batch["responses"][r, :R].tolist() == part.batch["responses"][j].tolist()
            assert out.batch["response_mask"][r, :R].tolist() == part.batch["response_mask"][j].tolist()
            assert int(out.batch["response_mask"][r, R:].sum()) == 0
    for r in loop_rows:
        first, second = out.non_tensor_batch["first_ids"][r], out.non_tensor_batch["second_ids"][r]
        assert out.batch["responses"][r, :len(first) + 2 + len(second)].tolist() == first + NUDGE + second
        assert out.non_tensor_batch["messages"][r] is None
    for r in tool_rows:
        assert out.non_tensor_batch["first_ids"][r] is None and isinstance(out.non_tensor_batch["messages"][r], list)
    assert not torch.equal(out.batch["responses"][tool_rows[0]], out.batch["responses"][loop_rows[0]])
    trainer.fit()  # two steps on mixed batches: scored, trained on
    trainer.tracker.close()
    records = records_of(trainer)
    assert len(records) == 2 and all(np.isfinite(r["actor/pg_loss"]) for r in records)
    # step 1's batch is the mixed one above: the two-turn rows' two calls each, the tool rows' metrics beside
    assert records[0]["agent/calls"] == 6 and "multi_turn/tool_call_rate" in records[0]


@pytest.mark.parametrize("schedule", ["request", "turn"])
def test_a_ready_call_does_not_wait_for_another_loops_generation(tiny_config, schedule):
    """Row 0 asks for 40 tokens at once; the other rows ask for 2 after 5 ms of their own I/O. Per
    request (the default) their calls join the engine's running rows while row 0 decodes and all
    return before it; under schedule=turn row 0's round runs alone (the others were in I/O) and
    they wait for it."""
    loops.FINISHED.clear()
    trainer, batch = rollout_of(tiny_config, "actor_rollout_ref.rollout.agent.default_agent_loop=long_and_short",
                                "data.max_response_length=40", f"actor_rollout_ref.rollout.multi_turn.schedule={schedule}")
    generate(trainer, batch)
    order = [name for name, _ in loops.FINISHED]
    assert dict(loops.FINISHED)["long"] >= 20  # it decoded for a while (the tiny model rarely stops)
    assert order == (["short"] * 5 + ["long"] if schedule == "request" else ["long"] + ["short"] * 5), loops.FINISHED


def test_a_loops_split_samples_share_a_batch_with_tool_agent_rows(tiny_config, tmp_path, tiny_data, loops_file):  # noqa: F811
    """One prompt names tool_agent, the other a registered loop whose episodes are two samples each
    (``split_samples``): the joined batch holds the batch's rows in order, each episode's samples
    together (3 tool rows, 6 loop rows), the prompt batch expands onto them row for row, and a
    training step runs on it (the group check: n = 3 episodes per prompt)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from rlvr.protocol import episode_rows, expand_to_samples

    table = pq.read_table(tiny_data["train"]).to_pylist()
    for i, row in enumerate(table):
        row["agent_name"] = "tool_agent" if i % 2 == 0 else "splits"
    named = tmp_path / "named.parquet"
    pq.write_table(pa.Table.from_pylist(table), named)
    trainer, batch = rollout_of(tiny_config, f"data.train_files=[{named}]", "data.return_raw_chat=true",
                                "data.max_response_length=24", "data.max_prompt_length=512",
                                "actor_rollout_ref.rollout.multi_turn.enable=true",
                                "actor_rollout_ref.rollout.multi_turn.tool_config_path=calculator",
                                f"actor_rollout_ref.rollout.agent.agent_loop_config_path={loops_file}")
    batch, gen = trainer._dispatch(batch, 1, 0)
    out = trainer.rollout_wg.generate_sequences(gen)
    names = list(gen.non_tensor_batch["agent_name"])
    rows = episode_rows(out).tolist()
    assert rows == [r for r, n in enumerate(names) for _ in range(2 if n == "splits" else 1)]
    assert out.non_tensor_batch["episode_sample"].tolist() == [k for n in names
                                                              for k in (range(2) if n == "splits" else [0])]
    assert list(out.non_tensor_batch["agent_name"]) == [names[r] for r in rows]
    R = out.batch["responses"].shape[1]
    for i, r in enumerate(rows):  # a later sample's prompt is its episode's prompt and NUDGE
        prompt = out.batch["prompts"][i][out.batch["attention_mask"][i, :-R].bool()].tolist()
        first = gen.batch["input_ids"][r][gen.batch["attention_mask"][r].bool()].tolist()
        if names[r] == "splits":
            assert prompt == first + (NUDGE if out.non_tensor_batch["episode_sample"][i] else [])
    joined = expand_to_samples(batch, out).union(out)
    assert joined.non_tensor_batch["uid"].tolist() == [batch.non_tensor_batch["uid"][r] for r in rows]
    trainer.fit()
    trainer.tracker.close()
    assert records_of(trainer)[0]["agent/split_samples"] == 3.0


def test_a_call_cancelled_while_its_round_runs_leaves_the_others_answered():
    """A call whose caller went away while its round was generating (an agent's client timed out,
    the gateway's route cancelled it): the round answers the other calls and the rollout goes on.
    Before, the round set a result on the cancelled call's future: InvalidStateError ended the
    whole rollout (rollout servers, whose rounds await the replicas)."""
    import asyncio

    from rlvr.agents.rollout import RoundServer, _row
    from rlvr.rollout.base import Completion
    from rlvr.rollout.sampling import SamplingParams

    class SlowEngine:  # a rollout server: each round awaits its replicas
        async def agenerate(self, prompts, params):
            await asyncio.sleep(0.05)
            return [Completion([7, p[0]], [-0.5, -0.25], "length") for p in prompts]

    async def main():
        server = RoundServer(SlowEngine(), SamplingParams(max_new_tokens=2))

        async def call(row: int):
            _row.set(row)
            return await server.generate(f"r{row}", prompt_ids=[100 + row])

        calls = [asyncio.ensure_future(call(row)) for row in range(3)]
        await asyncio.sleep(0)  # every call waits for the round
        round_ = asyncio.ensure_future(server.run_round())
        await asyncio.sleep(0.01)  # the round is generating
        calls[1].cancel()
        await round_
        return [calls[0].result(), calls[2].result(), calls[1].cancelled()]

    first, third, cancelled = asyncio.run(main())
    assert (first.token_ids, third.token_ids, cancelled) == ([7, 100], [7, 102], True)
