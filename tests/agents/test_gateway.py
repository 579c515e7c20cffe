"""The OpenAI gateway (openai_agent): agents of the user's, written with the openai client or as a
process, trained on the tokens the model sampled; broken and hostile agents fail their episode
alone."""

import json
import sys

import pytest

from rlvr.trainer.main import build_trainer
from tests.agents import gateway_agents
from tests.agents.test_agent_loops import QUIET, generate
from tests.trainer.conftest import interrupt_and_resume, tiny_config, tiny_data  # noqa: F401 (fixtures)
from tests.trainer.test_learning import LEADING_SPACE, LEARN, train

GATEWAY = ("actor_rollout_ref.rollout.agent.default_agent_loop=openai_agent", "data.return_raw_chat=true",
           "data.max_response_length=48")


def agent(name):
    return f"actor_rollout_ref.rollout.agent.gateway.function=tests.agents.gateway_agents:{name}"


def test_a_chat_agent_trains_on_the_tokens_it_was_sampled(tiny_config):
    """Two chat calls per episode through the openai client: the trajectory is the first call's
    sampled ids, the ids between (the template's end-of-turn glue and the user's reply, mask 0),
    the second call's sampled ids, bit for bit as the responses carried them; the second prompt
    extends the first prompt and its sampled tokens (nothing re-tokenised), so no context break."""
    gateway_agents.SEEN.clear()
    trainer = build_trainer(tiny_config(*QUIET, *GATEWAY, agent("two_chats")), progress_bar=False)
    batch = next(iter(trainer._batches()))[0]
    _, out = generate(trainer, batch)
    assert out.meta_info["rollout_metrics"]["agent/context_breaks"] == 0.0
    assert len(gateway_agents.SEEN) == len(out)  # one key per episode
    by_prompt = {}
    for calls in gateway_agents.SEEN.values():
        (p1, s1), (p2, s2) = calls
        assert p2[:len(p1) + len(s1)] == p1 + s1  # the sampled tokens, not a re-rendering of their text
        glue = p2[len(p1) + len(s1):]
        by_prompt.setdefault(tuple(p1 + s1 + glue + s2), (p1, s1, glue, s2))
    for r in range(len(out)):
        n = int(out.batch["attention_mask"][r, -out.batch["responses"].shape[1]:].sum())
        prompt = out.batch["prompts"][r][out.batch["attention_mask"][r, :out.batch["prompts"].shape[1]].bool()].tolist()
        response = out.batch["responses"][r, :n].tolist()
        p1, s1, glue, s2 = by_prompt[tuple(prompt + response)]
        assert prompt == p1 and response == s1 + glue + s2
        assert out.batch["response_mask"][r, :n].tolist() == [1] * len(s1) + [0] * len(glue) + [1] * len(s2)
    assert list(out.non_tensor_batch["reward_score"]) == [float(r) for r in out.non_tensor_batch["reward_score"]]


def learns(tiny_config, tmp_path, name: str) -> list[dict]:
    """Ten GRPO steps (lr 1e-1) of agent ``name``: its records, after asserting its reward rose
    from below 0.8 to at least 0.9 over the last three steps."""
    _, records = train(tiny_config, tmp_path, LEADING_SPACE, *LEARN, *GATEWAY, agent(name),
                       "actor_rollout_ref.actor.optim.lr=1e-1", "trainer.total_training_steps=10",
                       "trainer.freshness_check_freq=-1")
    scores = [r["critic/score/mean"] for r in records]
    assert scores[0] < 0.8 and min(scores[-3:]) >= 0.9, scores
    return records


@pytest.mark.slow  # 10 steps of 16 episodes: about 30 s
def test_a_chat_agent_learns(tiny_config, tmp_path):
    """GRPO on the agent's own reward (its first answer starts with a space): it rises."""
    records = learns(tiny_config, tmp_path, "two_chats")
    assert all(r["agent/failed"] == 0.0 and r["agent/episode_calls"] == 2.0 for r in records)


def test_a_process_agent_over_urllib_trains(tiny_config, tmp_path):
    """gateway.command: a script with the standard library only, the row on stdin, its reward on
    stdout; three steps train."""
    script = tmp_path / "agent.py"
    script.write_text('''
import json, os, sys, urllib.request
row = json.load(sys.stdin)
body = json.dumps({"model": "rlvr-policy", "messages": row["raw_prompt"], "max_tokens": 5}).encode()
request = urllib.request.Request(os.environ["OPENAI_BASE_URL"] + "/chat/completions", data=body, headers={
    "Authorization": "Bearer " + os.environ["OPENAI_API_KEY"], "Content-Type": "application/json"})
answer = json.load(urllib.request.urlopen(request, timeout=60))
print(float(answer["choices"][0]["message"]["content"].startswith(" ")))
''')
    _, records = train(tiny_config, tmp_path, LEADING_SPACE, *GATEWAY, "trainer.total_training_steps=3",
                       "trainer.freshness_check_freq=-1",
                       f"actor_rollout_ref.rollout.agent.gateway.command={sys.executable} {script}")
    assert len(records) == 3 and all(r["agent/failed"] == 0.0 and r["agent/episode_calls"] == 1.0 for r in records)
    assert any(r["actor/grad_norm"] > 0 for r in records)


def test_a_rewritten_context_splits_the_episode_into_samples(tiny_config):
    """The second call's context replaces the first answer: each episode is two samples, each the
    prompt and sampled ids of its own call bit for bit (mask 1 on every response token), in the
    episode's order (episode_sample 0 then 1), the break and the extra sample counted; the batch's
    rows follow its episodes, so the rows of the prompt batch repeat for each sample."""
    from rlvr.protocol import episode_rows, expand_to_samples, final_samples

    gateway_agents.SEEN.clear()
    trainer = build_trainer(tiny_config(*QUIET, *GATEWAY, agent("rewrites")), progress_bar=False)
    batch, out = generate(trainer, next(iter(trainer._batches()))[0])
    episodes = len(batch)  # 2 prompts x n = 3
    metrics = out.meta_info["rollout_metrics"]
    assert len(out) == 2 * episodes and metrics["agent/context_breaks"] == episodes == metrics["agent/split_samples"]
    assert out.non_tensor_batch["episode_sample"].tolist() == [0, 1] * episodes
    assert episode_rows(out).tolist() == [e for e in range(episodes) for _ in (0, 1)]
    assert final_samples(out).tolist() == [False, True] * episodes
    calls = {tuple(p + s) for seen in gateway_agents.SEEN.values() for p, s in seen}
    R = out.batch["responses"].shape[1]
    for r in range(len(out)):
        n = int(out.batch["attention_mask"][r, -R:].sum())
        prompt = out.batch["prompts"][r][out.batch["attention_mask"][r, :-R].bool()].tolist()
        assert tuple(prompt + out.batch["responses"][r, :n].tolist()) in calls
        assert out.batch["response_mask"][r, :n].tolist() == [1] * n
    joined = expand_to_samples(batch, out).union(out)
    assert joined.non_tensor_batch["uid"].tolist() == [u for u in batch.non_tensor_batch["uid"] for _ in (0, 1)]


def test_an_episode_in_samples_is_scored_once_and_counted_once_in_its_group(tiny_config, tmp_path):
    """The reward function scores each episode's final context (the answer after the rewrite);
    both samples carry that score, and the group check counts n episodes, not 2n rows."""
    import numpy as np

    reward = tmp_path / "space.py"
    reward.write_text(LEADING_SPACE)
    trainer = build_trainer(tiny_config(*QUIET, *GATEWAY, agent("rewrites_unscored"),
                                        f"reward.custom_reward_function.path={reward}"), progress_bar=False)
    trainer.global_step = 1
    batch, score = trainer._rollout(next(iter(trainer._batches()))[0], 0, {})
    trainer._attach_scores(batch, score)
    R = batch.batch["responses"].shape[1]
    texts = [trainer.tokenizer.decode(batch.batch["responses"][r][batch.batch["attention_mask"][r, -R:].bool()],
                                      skip_special_tokens=True) for r in range(len(batch))]
    sums = batch.batch["token_level_scores"].sum(-1).tolist()
    for e in range(len(batch) // 2):  # each episode's two rows: the score of the second (final) one's text
        assert sums[2 * e] == sums[2 * e + 1] == float(texts[2 * e + 1].startswith(" "))
    trainer._advantages(batch)  # check_groups: n = 3 episodes a group, 6 rows
    adv = batch.batch["advantages"]
    for e in range(len(batch) // 2):
        mask = batch.batch["response_mask"][2 * e:2 * e + 2].bool()
        values = adv[2 * e:2 * e + 2][mask]
        assert np.ptp(values.numpy()) < 1e-6  # one advantage for the episode's every token


@pytest.mark.slow  # 10 steps of 16 episodes: about 30 s
def test_an_agent_that_rewrites_its_context_learns_from_the_later_sample(tiny_config, tmp_path):
    """The reward is the answer after the rewrite (the episode's second sample): GRPO raises it,
    which it cannot when that sample is left out of the update (the first chain alone does not
    hold the tokens the reward judges)."""
    records = learns(tiny_config, tmp_path, "rewrites")
    assert all(r["agent/split_samples"] == 16.0 and r["agent/context_breaks"] == 16.0 for r in records)


@pytest.mark.parametrize("name, why", [
    ("raises", "RuntimeError: the agent's environment is down"),
    ("hangs", "ran past actor_rollout_ref.rollout.agent.gateway.timeout=2 s"),
    ("too_many_calls", "more than actor_rollout_ref.rollout.agent.gateway.max_calls=3 calls"),
    ("returns_text", "the agent returned str 'great': return a number or None"),
])
def test_a_bad_agent_fails_its_episode_alone(tiny_config, tmp_path, capsys, name, why):
    """Each failure is its episode's: the reason is printed, the episode's reward is NaN (counted,
    its group left out of the update) and the run goes on."""
    timeout = 2 if name == "hangs" else 60  # the others' calls must not race a 2 s limit on a loaded machine
    _, records = train(tiny_config, tmp_path, LEADING_SPACE, *GATEWAY, agent(name), "trainer.total_training_steps=1",
                       "trainer.freshness_check_freq=-1", f"actor_rollout_ref.rollout.agent.gateway.timeout={timeout}",
                       "actor_rollout_ref.rollout.agent.gateway.max_calls=3")
    assert why in capsys.readouterr().err
    r = records[0]
    assert r["agent/failed"] == 1.0 and r["reward/num_invalid"] == 6.0 and r["training/dropped_groups"] == 2.0


def test_an_agents_reward_may_be_any_kind_of_number():
    """numpy's and torch's scalars are numbers (they failed the episode as "not a number"); text,
    lists and several-element tensors are not."""
    import numpy as np
    import torch

    from rlvr.agents.gateway import as_reward

    assert [as_reward(v) for v in (None, 1, 0.5, True, np.float32(0.25), np.int64(3), np.array(0.75),
                                   torch.tensor(2.0), torch.tensor([0.5]))] == [None, 1.0, 0.5, 1.0, 0.25, 3.0, 0.75,
                                                                               2.0, 0.5]
    for bad in ("great", [1.0], torch.tensor([1.0, 2.0]), {"reward": 1}):
        with pytest.raises(ValueError, match="return a number or None"):
            as_reward(bad)


def test_an_agent_cannot_call_with_another_key(tiny_config, tmp_path):
    """A made-up key, or none: 401; the agent's own episode is unaffected."""
    _, records = train(tiny_config, tmp_path, LEADING_SPACE, *GATEWAY, agent("wrong_key"),
                       "trainer.total_training_steps=1", "trainer.freshness_check_freq=-1")
    assert records[0]["agent/failed"] == 0.0 and records[0]["critic/score/mean"] == 0.5


def test_the_example_agent_runs_as_documented(tiny_config, tmp_path):
    """examples/agents/chat_agent.py, as docs/agents.md runs it: two calls an episode, none failed."""
    from pathlib import Path

    example = Path(__file__).parents[2] / "examples" / "agents" / "chat_agent.py"
    _, records = train(tiny_config, tmp_path, LEADING_SPACE, *GATEWAY, "trainer.total_training_steps=1",
                       "trainer.freshness_check_freq=-1", f"actor_rollout_ref.rollout.agent.gateway.function={example}:agent")
    assert records[0]["agent/failed"] == 0.0 and records[0]["agent/episode_calls"] == 2.0


def test_ctrl_c_and_resume_with_a_gateway_agent_equal_the_uninterrupted_run(tiny_config, tmp_path,
                                                                            interrupt_and_resume):
    """A deterministic agent (two chat calls an episode, the second with the run's seeds): Ctrl-C
    at step 3 saves, and the resumed run ends with the uninterrupted one's weights and scores."""
    import torch

    def config(folder):
        return tiny_config(*QUIET, *GATEWAY, agent("two_chats"), "trainer.total_training_steps=3",
                           "trainer.save_freq=1", "trainer.val_before_train=false", "trainer.freshness_check_freq=-1",
                           f"trainer.default_local_dir={tmp_path / folder}")

    straight = build_trainer(config("a"), progress_bar=False)
    straight.fit()
    straight.tracker.close()
    resumed = interrupt_and_resume(build_trainer(config("b"), progress_bar=False), 3, "step 2 was already saved")
    for a, b in zip(straight.wg.worker.actor.model.parameters(), resumed.wg.worker.actor.model.parameters()):
        torch.testing.assert_close(a, b, atol=0, rtol=0)

    def scores(folder):
        return [json.loads(line).get("critic/score/mean") for line in open(tmp_path / folder / "metrics.jsonl")]

    assert scores("a") == scores("b") and len(scores("a")) == 3


def test_validation_scores_each_split_episode_once_on_its_final_context(tiny_config, tmp_path):
    """Validation of an agent that rewrites its context: one score per prompt (n = 1 greedy), that
    of the answer after the rewrite, never of the first chain."""
    reward = tmp_path / "space.py"
    reward.write_text(LEADING_SPACE)
    trainer = build_trainer(tiny_config(*QUIET, *GATEWAY, agent("rewrites_unscored"),
                                        f"reward.custom_reward_function.path={reward}"), progress_bar=False)
    scored = []
    score = trainer.val_reward_fn

    def spy(batch):
        scored.append(batch)
        return score(batch)

    trainer.val_reward_fn = spy
    metrics = trainer.validate()
    batch = scored[0]
    assert len(batch) == len(trainer.val_dataset) and "episode_sample" not in batch.non_tensor_batch
    R = batch.batch["responses"].shape[1]
    prompts = [trainer.tokenizer.decode(batch.batch["prompts"][r][batch.batch["attention_mask"][r, :-R].bool()])
               for r in range(len(batch))]
    assert all("Go on." in p for p in prompts)  # the final context: the rewritten conversation
    assert any(k.endswith("mean@1") for k in metrics)


def test_split_episodes_train_one_step_off(tiny_config, tmp_path):
    """Generated ahead (trainer.v1 colocate_async, one batch ahead): the queued prompt batch is
    joined to its split samples as in the synchronous step, and each step trains 2n samples."""
    _, records = train(tiny_config, tmp_path, LEADING_SPACE, *GATEWAY, agent("rewrites"), "trainer.total_training_steps=3",
                       "trainer.freshness_check_freq=-1", "trainer.v1.trainer_mode=colocate_async",
                       "trainer.v1.colocate_async.num_warmup_batches=1")
    assert [r["agent/split_samples"] for r in records] == [6.0] * 3  # the union with 6 prompt rows raised before


def test_a_call_that_stops_answers_its_agent(tiny_config, tmp_path):
    """A call that ends on a stop (not at its length) answers 200 with finish_reason "stop"
    (it answered 500 when the gateway's completions, which name no matched stop, reached vLLM's
    stop_reason field; every episode of the built-in model that ended at its end-of-turn failed).
    Its text ends before the stop string, which is its stop_reason, as vLLM's and OpenAI's do
    (chat, completion, streamed chat); the text carried the stop string and what followed it in
    its last token, and stop_reason was null."""
    gateway_agents.STOPPED.clear()
    trainer = build_trainer(tiny_config(*QUIET, *GATEWAY, agent("stops")), progress_bar=False)
    _, out = generate(trainer, next(iter(trainer._batches()))[0])
    assert out.meta_info["rollout_metrics"]["agent/failed"] == 0.0
    stopped = [s for s in gateway_agents.STOPPED if s[0] == "stop"]
    assert len(stopped) >= 3, gateway_agents.STOPPED
    for _, reason, text, ids in stopped:
        whole = trainer.tokenizer.decode(ids, skip_special_tokens=True)
        # vLLM's StopChecker: the first stop string of the request's list found in the new text; the
        # text ends where it starts (" Josef" with stop ["e", "a", "o", " "]: "e", " Jos")
        expected = next(s for s in gateway_agents.STOPS if s in whole)
        assert (reason, text) == (expected, whole[:whole.index(expected)]), whole


def _command_episode(command: str, timeout: float):
    """Run ``command`` as one episode's agent process (``OpenAIAgentLoop._agent``) under ``timeout``."""
    import asyncio
    from types import SimpleNamespace

    from rlvr.agents.gateway import Episode, OpenAIAgentLoop

    gateway = SimpleNamespace(agent=None, base_url="http://127.0.0.1:9/v1")
    loop = OpenAIAgentLoop(None, None, None, gateway=gateway)
    cfg = SimpleNamespace(command=command)
    return asyncio.run(asyncio.wait_for(loop._agent(Episode(0, "k"), {"x": 1}, cfg), timeout))


def _alive(pid: int) -> bool:
    import os
    import time

    for _ in range(50):  # a killed process is gone (or a zombie of init's) within moments
        try:
            with open(f"/proc/{pid}/stat") as stat:
                if stat.read().split(")")[-1].split()[0] == "Z":
                    return False
        except FileNotFoundError:
            return False
        time.sleep(0.02)
    return True


@pytest.mark.parametrize("holds_stdout", [False, True], ids=["lets_go", "holds_stdout"])
def test_an_agent_commands_children_end_with_its_episode(tmp_path, holds_stdout):
    """A command that starts a background child and exits: the child is stopped when the episode
    ends, whether it let go of stdout (the episode ends with the command) or held it (the episode
    runs to its timeout). Before, the child outlived the episode: it was killed only when the
    command itself was still running at the end."""
    import asyncio

    pidfile = tmp_path / "child.pid"
    redirect = "" if holds_stdout else " >/dev/null 2>&1"
    command = f"sleep 300{redirect} & echo $! > {pidfile}; echo 0.5"
    if holds_stdout:
        with pytest.raises(asyncio.TimeoutError):
            _command_episode(command, 1.0)
    else:
        assert _command_episode(command, 30) == 0.5
    pid = int(pidfile.read_text())
    assert not _alive(pid), "the agent command's child outlived its episode"


def test_an_agent_command_that_floods_stdout_is_read_to_its_last_line():
    """100 MB of log on stdout before the reward: the episode reads its reward from the last line
    without holding the whole output (before, all of it was kept: an agent's verbose log could
    take the trainer's memory)."""
    import tracemalloc

    tracemalloc.start()
    try:
        reward = _command_episode("head -c 100000000 /dev/zero | tr '\\0' x; echo; echo 0.25", 120)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert reward == 0.25
    assert peak < 20_000_000, f"{peak / 1e6:.0f} MB held for a 100 MB stdout"


def test_an_agent_that_cuts_the_models_answer_is_answered_on_its_own_messages(tiny_config):
    """The agent sends back the model's first answer cut to two characters: the second call's prompt
    is its messages as the chat template renders them (the cut answer), a context break that splits
    the episode. Before, the whole sampled answer was put back in place of the agent's cut (it is
    a part of the answer's text), so the model was conditioned on text the agent had removed."""
    gateway_agents.SEEN.clear()
    trainer = build_trainer(tiny_config(*QUIET, *GATEWAY, agent("trims")), progress_bar=False)
    batch, out = generate(trainer, next(iter(trainer._batches()))[0])
    assert out.meta_info["rollout_metrics"]["agent/context_breaks"] == len(batch)
    tok = trainer.tokenizer
    for (_, sampled, _), (prompt, _, messages) in gateway_agents.SEEN.values():
        rendered = tok.encode(tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False),
                              add_special_tokens=False)
        assert prompt == rendered and len(sampled) > 2


@pytest.mark.parametrize("field", ["stop_token_ids", "ignore_eos"])
def test_a_call_asking_for_other_end_tokens_is_refused_by_name(field):
    """The rollout's end tokens end every call while training: a call's stop_token_ids was refused,
    its ignore_eos dropped without a word (the agent believed it decoded past the end token)."""
    import asyncio
    import contextvars
    from types import SimpleNamespace

    from rlvr.agents.gateway import Episode, GatewayEngine, _episode
    from rlvr.rollout.sampling import SamplingParams
    from rlvr.serve.protocol import BadRequest

    engine = GatewayEngine(rounds=None, params=SamplingParams(max_new_tokens=8), max_calls=4, decode=str)
    request = SimpleNamespace(stop_token_ids=(7,) if field == "stop_token_ids" else (), ignore_eos=field == "ignore_eos")
    context = contextvars.copy_context()  # the episode is this call's, not the test process's
    context.run(_episode.set, Episode(0, "k"))
    with pytest.raises(BadRequest, match=rf"^{field}: not taken while training"):
        context.run(asyncio.run, engine.generate(request))
