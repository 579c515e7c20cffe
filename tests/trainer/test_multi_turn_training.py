"""Multi-turn GRPO end to end on the tiny model: the first turn of every trajectory calls the
calculator (scripted, with the model's own log-probs), the rest is sampled. Everything
downstream of the rollout reads tool tokens correctly, and a resumed run equals the
uninterrupted one."""

import json

import pytest
import torch

from rlvr.data.prepare import prepare_calculator
from rlvr.errors import TrainingInterrupted
from rlvr.trainer.main import build_trainer

CALL = "<calculator>2 + 3</calculator>"
LOGPROB_TOL = 2e-3  # vLLM's CPU kernels against transformers' forward (tests/rollout/test_vllm.py)


def script(ctx):
    return CALL if ctx.count("<|im_start|>tool") < 2 else None  # the example turn holds one tool message


@pytest.fixture
def forced_calls(scripted_engine):
    scripted_engine(script)


@pytest.fixture(scope="module")
def tool_data(tmp_path_factory):
    return prepare_calculator(tmp_path_factory.mktemp("calc"), train_size=16, test_size=4)


@pytest.fixture
def tool_config(tiny_config, tool_data):
    def make(*overrides):
        return tiny_config(f"data.train_files=[{tool_data['train']}]", f"data.val_files=[{tool_data['test']}]",
                           "data.max_prompt_length=320", "data.max_response_length=40", "data.return_raw_chat=true",
                           "actor_rollout_ref.rollout.multi_turn.enable=true",
                           "actor_rollout_ref.rollout.multi_turn.tool_config_path=calculator",
                           "actor_rollout_ref.rollout.multi_turn.format=tag",
                           "actor_rollout_ref.rollout.multi_turn.max_assistant_turns=2",
                           # the scripted calls are not the model's greedy tokens: the freshness probe would
                           # (rightly) find an engine that does not sample from the actor's weights
                           "trainer.freshness_check_freq=-1", *overrides)
    return make


def weights(trainer):
    return [p.detach().clone() for p in trainer.wg.worker.actor.model.parameters()]


def records(run_dir):
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("engine", ["native", "vllm"])
def test_multi_turn_grpo_steps_train_on_the_models_tokens_only(tool_config, tmp_path, scripted_engine, engine,
                                                               tiny_vllm_model_dir):
    """With either engine: tool tokens masked, the model's tokens trained on with the log-probs
    the engine sampled them with (vLLM's within its stated tolerance)."""
    scripted_engine(script, engine)
    vllm = [f"actor_rollout_ref.model.path={tiny_vllm_model_dir}", "actor_rollout_ref.rollout.name=vllm"]
    config = tool_config("trainer.test_freq=2", "actor_rollout_ref.actor.recompute_old_log_prob=true",
                         *(vllm if engine == "vllm" else []))
    trainer = build_trainer(config, progress_bar=False)
    before = weights(trainer)
    trainer.fit()
    trainer.tracker.close()
    assert any(not torch.equal(a, b) for a, b in zip(before, weights(trainer)))
    step = [r for r in records(tmp_path / "run") if "multi_turn/tool_calls" in r][-1]
    assert step["multi_turn/tool_calls"] == 1.0 and step["multi_turn/tool_calls/calculator"] == 1.0
    assert step["num_turns/max"] == 4.0 and step["multi_turn/tool_tokens/mean"] > 0
    # the rollout's log-probs equal the training forward's at the model's tokens (old_log_probs pass)
    assert step["training/rollout_probs_diff_max"] < (1e-4 if engine == "native" else LOGPROB_TOL)
    val = [r for r in records(tmp_path / "run") if "val-aux/multi_turn/tool_call_rate" in r]
    assert val and val[-1]["val-aux/multi_turn/tool_call_rate"] == 1.0
    # the dump holds the conversation: each call and its result readable
    dumped = json.loads((tmp_path / "run" / "rollouts" / "2.jsonl").read_text().splitlines()[0])
    roles = [m["role"] for m in dumped["messages"]]
    assert roles[:2] == ["assistant", "tool"] and dumped["messages"][1]["content"] == "5"
    assert CALL in dumped["response"]


def test_multi_turn_run_resumes_exactly(tool_config, tmp_path, forced_calls, interrupt_and_resume):
    straight = build_trainer(tool_config("trainer.total_training_steps=3", "trainer.save_freq=1",
                                         "trainer.val_before_train=false",
                                         f"trainer.default_local_dir={tmp_path / 'a'}"), progress_bar=False)
    straight.fit()
    straight.tracker.close()
    config = tool_config("trainer.total_training_steps=3", "trainer.save_freq=1", "trainer.val_before_train=false",
                         f"trainer.default_local_dir={tmp_path / 'b'}")
    resumed = interrupt_and_resume(build_trainer(config, progress_bar=False), 3, "step 2 was already saved")
    for a, b in zip(weights(straight), weights(resumed)):
        torch.testing.assert_close(a, b, atol=0, rtol=0)
    assert [r.get("critic/score/mean") for r in records(tmp_path / "a")] == \
        [r.get("critic/score/mean") for r in records(tmp_path / "b")]


def test_remax_greedy_baseline_is_scored_on_its_own_trajectory(tool_config, tmp_path, forced_calls):
    """The greedy trajectory's turns reach the scorer as the samples' do (here: score = turns)."""
    import numpy as np

    from rlvr.trainer.evaluate import generation_batch

    turns = tmp_path / "turns.py"
    turns.write_text("def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
                     "    return float(extra_info['num_turns'])\n")
    trainer = build_trainer(tool_config("algorithm.adv_estimator=remax", f"reward.custom_reward_function.path={turns}"),
                            progress_bar=False)
    batch, _ = next(trainer._batches())
    batch.non_tensor_batch["uid"] = np.array([f"u{i}" for i in range(len(batch))], dtype=object)
    n = trainer.config.actor_rollout_ref.rollout.n
    gen = generation_batch(batch).repeat(n, interleave=True)
    baselines = trainer._greedy_baselines(gen, batch.repeat(n, interleave=True))
    assert baselines.tolist() == [4.0] * len(gen)  # prompt, the forced call, its answer, the greedy answer


def test_one_step_off_multi_turn_calls_tools_on_the_engine_ahead(tool_config, tmp_path, forced_calls, interrupt):
    """trainer.v1.trainer_mode=colocate_async with tools: the engine ahead runs the whole
    conversation (model turns, calculator calls) with the weights before the last update;
    its tool tokens carry no loss, and a run resumed mid-way equals the straight one."""
    common = ("trainer.v1.trainer_mode=colocate_async", "trainer.v1.colocate_async.num_warmup_batches=1",
              "trainer.total_training_steps=3", "trainer.val_before_train=false")
    straight = build_trainer(tool_config(*common, f"trainer.default_local_dir={tmp_path / 'a'}"), progress_bar=False)
    straight.fit()
    straight.tracker.close()
    got = records(tmp_path / "a")
    assert all(r["multi_turn/tool_calls"] == 1.0 and r["multi_turn/tool_tokens/mean"] > 0 for r in got)
    assert [r["training/off_policy/trajectory_staleness/max"] for r in got] == [0, 1, 1]
    row = json.loads((tmp_path / "a" / "rollouts" / "3.jsonl").read_text().splitlines()[0])
    assert row["policy_version"] == 1 and [m["role"] for m in row["messages"]][:2] == ["assistant", "tool"]
    config = tool_config(*common, "trainer.save_freq=1", f"trainer.default_local_dir={tmp_path / 'b'}")
    first = build_trainer(config, progress_bar=False)
    interrupt(first, first.ahead, "take", 3)  # Ctrl-C waiting for batch 3: step 2 and batch 3 saved
    with pytest.raises(TrainingInterrupted, match="interrupted after step 2"):
        first.fit()
    first.tracker.close()
    resumed = build_trainer(config, progress_bar=False)
    assert resumed.global_step == 2 and sorted(resumed.ahead.pending) == [3]
    resumed.fit()
    resumed.tracker.close()
    for a, b in zip(weights(straight), weights(resumed)):
        torch.testing.assert_close(a, b, atol=0, rtol=0)


JUDGE = '''
from rlvr.tools.interaction import BaseInteraction

class Judge(BaseInteraction):
    """Never satisfied: asks again with a score of 0.25 each turn."""
    async def generate_response(self, instance_id, messages, **kwargs):
        return False, "Again, " + kwargs["who"] + ".", 0.25, {}
'''

TURN_SCORE_SUM = '''
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    return float(sum(extra_info["turn_scores"]))
'''


def test_an_interaction_answers_each_turn_and_its_scores_reach_the_reward(tiny_config, tmp_path, scripted_engine):
    """verl's interaction, end to end without tools: the rows name it in extra_info.interaction_kwargs;
    it answers max_user_turns = 2 turns (0.25 each) and the model's third turn ends the episode; a
    reward function summing extra_info["turn_scores"] scores every sample 0.5."""
    scripted_engine(lambda ctx: "Five.<|im_end|>")  # every model turn: a short answer the engine scores
    (tmp_path / "judge.py").write_text(JUDGE)
    (tmp_path / "interactions.yaml").write_text("interaction:\n  - class_name: judge.py:Judge\n")
    (tmp_path / "reward.py").write_text(TURN_SCORE_SUM)
    rows = [{"data_source": "toy", "prompt": [{"role": "user", "content": f"Say a number, {i}."}],
             "reward_model": {"ground_truth": "1"},
             "extra_info": {"interaction_kwargs": {"name": "judge", "who": f"student {i}"}}} for i in range(4)]
    (tmp_path / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    config = tiny_config(f"data.train_files=[{tmp_path / 'train.jsonl'}]", "data.val_files=[]",
                         "trainer.val_before_train=false", "data.return_raw_chat=true", "data.max_response_length=48",
                         "trainer.total_training_steps=1", "trainer.freshness_check_freq=-1",
                         f"reward.custom_reward_function.path={tmp_path / 'reward.py'}",
                         "actor_rollout_ref.rollout.multi_turn.enable=true", "actor_rollout_ref.rollout.multi_turn.format=tag",
                         f"actor_rollout_ref.rollout.multi_turn.interaction_config_path={tmp_path / 'interactions.yaml'}",
                         "actor_rollout_ref.rollout.multi_turn.max_user_turns=2")
    trainer = build_trainer(config, progress_bar=False)
    trainer.fit()
    trainer.tracker.close()
    (step,) = records(tmp_path / "run")
    dumped = [json.loads(line) for line in (tmp_path / "run" / "rollouts" / "1.jsonl").read_text().splitlines()]
    assert len(dumped) == 6
    for d in dumped:
        assert [m["role"] for m in d["messages"]] == ["assistant", "user", "assistant", "user", "assistant"]
        assert d["messages"][1]["content"].startswith("Again, student ")
        assert d["turn_scores"] == [0.25, 0.25] and d["score"] == 0.5
