"""Interactions (verl's BaseInteraction) in the multi-turn loop: the answer's tokens are context,
never trained on; turn scores reach the reward function; the episode ends when the interaction
says so or at max_user_turns; bad interactions and rows fail with their names."""

import asyncio

import numpy as np
import pytest

from rlvr.config import ConfigError, load_config
from rlvr.rewards.manager import with_trajectory_info
from rlvr.tools.config import ToolConfigError
from rlvr.tools.interaction import BaseInteraction, Gsm8kInteraction, default_name, load_interactions
from tests.rollout.test_multi_turn import ANSWER, QUESTION, make_rollout, prompts_for, tiny  # noqa: F401 (fixture)

RETRY = "Wrong. Try again."


class Teacher(BaseInteraction):
    """Answers "Wrong" (score 0) until the model says 408, then ends the episode (score 1)."""

    def __init__(self, config):
        super().__init__(config)
        self.started, self.finalized, self.seen = [], [], []

    async def start_interaction(self, instance_id=None, **kwargs):
        self.started.append((instance_id, kwargs))
        return f"i-{instance_id}"

    async def generate_response(self, instance_id, messages, **kwargs):
        self.seen.append([m["role"] for m in messages])
        if "408" in messages[-1]["content"]:
            return True, "Correct!", 1.0, {}
        return False, RETRY, 0.0, {}

    async def finalize_interaction(self, instance_id, **kwargs):
        self.finalized.append(instance_id)


def with_interaction(rollout, teacher, batch, kwargs=None):
    rollout.interactions = {"teacher": teacher}
    batch.non_tensor_batch["extra_info"] = np.array(
        [{"interaction_kwargs": kwargs or {"name": "teacher", "ground_truth": "408"}} for _ in range(len(batch))],
        dtype=object)
    return batch


def wrong_then_right(context):
    """First turn a wrong answer; after the user's retry, the right one."""
    return ANSWER if RETRY in context else "It is 400.<|im_end|>"


def test_the_answer_is_context_and_the_episode_ends_when_the_interaction_says(tiny, tokenizer, teacher_forced_engine):
    rollout, chat = make_rollout(tiny, teacher_forced_engine, wrong_then_right, tools={}, max_len=64)
    teacher = Teacher({"name": "teacher"})
    batch = with_interaction(rollout, teacher, prompts_for(rollout, chat, n=2))
    out = rollout.generate_sequences(batch)
    wrong = tokenizer.encode("It is 400.<|im_end|>", add_special_tokens=False)
    retry = chat.tool_delta([{"role": "user", "content": RETRY}], "<|im_end|>")  # "\n<|im_start|>user\nWrong...<|im_end|>\n<|im_start|>assistant\n"
    right = tokenizer.encode(ANSWER, add_special_tokens=False)
    done = chat.tool_delta([{"role": "user", "content": "Correct!"}], "<|im_end|>")
    expected = wrong + retry + right + done  # the episode ends on the interaction's (masked) answer, as in verl
    for row in range(2):
        n = int(out.batch["attention_mask"][row, -out.batch["responses"].shape[1]:].sum())
        assert out.batch["responses"][row, :n].tolist() == expected
        assert out.batch["response_mask"][row, :n].tolist() == [1] * len(wrong) + [0] * len(retry) + [1] * len(right) \
            + [0] * len(done)
    assert list(out.non_tensor_batch["turn_scores"]) == [[0.0, 1.0], [0.0, 1.0]]
    assert list(out.non_tensor_batch["finish_reason"]) == ["interaction", "interaction"]
    assert [m["role"] for m in out.non_tensor_batch["messages"][0]] == ["assistant", "user", "assistant", "user"]
    assert teacher.seen[0] == ["user", "assistant"]  # the conversation so far, the prompt's turn first
    assert [kw for _, kw in teacher.started] == [{"name": "teacher", "ground_truth": "408"}] * 2
    assert sorted(teacher.finalized) == sorted(f"i-{rid}" for rid, _ in teacher.started)  # every episode ended
    assert out.non_tensor_batch["multi_turn_metrics"][0]["interaction_turns"] == 2
    # the reward function sees the turn scores in extra_info, as verl's reward loop passes them
    out.non_tensor_batch["extra_info"] = batch.non_tensor_batch["extra_info"]
    infos = with_trajectory_info(out)
    assert [info["turn_scores"] for info in infos] == [[0.0, 1.0], [0.0, 1.0]]
    assert infos[0]["interaction_kwargs"]["ground_truth"] == "408"  # the row's own extra_info stays


def test_max_user_turns_ends_the_episode_after_the_model_turn(tiny, teacher_forced_engine):
    """An interaction that never ends: max_user_turns = 2 answers, then one more model turn ends it."""
    rollout, chat = make_rollout(tiny, teacher_forced_engine, lambda ctx: "No.<|im_end|>", tools={}, max_len=200,
                                 max_user_turns=2)
    teacher = Teacher({"name": "teacher"})
    out = rollout.generate_sequences(with_interaction(rollout, teacher, prompts_for(rollout, chat)))
    assert out.non_tensor_batch["finish_reason"][0] == "max_user_turns"
    assert out.non_tensor_batch["num_turns"][0] == 6 and out.non_tensor_batch["turn_scores"][0] == [0.0, 0.0]


def test_rows_without_kwargs_run_plain_and_unknown_names_are_refused(tiny, teacher_forced_engine):
    rollout, chat = make_rollout(tiny, teacher_forced_engine, lambda ctx: ANSWER, tools={}, max_len=64)
    teacher = Teacher({"name": "teacher"})
    batch = prompts_for(rollout, chat, rows=[QUESTION, QUESTION])
    batch = with_interaction(rollout, teacher, batch)
    batch.non_tensor_batch["extra_info"][1] = {}  # this row has no interaction: one turn, no answer
    out = rollout.generate_sequences(batch)
    assert list(out.non_tensor_batch["finish_reason"]) == ["interaction", "stop"]
    assert list(out.non_tensor_batch["turn_scores"]) == [[1.0], []]
    batch = with_interaction(rollout, teacher, prompts_for(rollout, chat), {"name": "tutor"})
    with pytest.raises(ValueError, match=r"sample 0 .*names interaction 'tutor'.*known: \['teacher'\]"):
        rollout.generate_sequences(batch)


@pytest.mark.parametrize("bad, reason", [
    ("raise", "interaction 'teacher' failed: RuntimeError: down"),
    ("shape", "generate_response returned"),
])
def test_a_broken_interaction_fails_its_request_only(tiny, teacher_forced_engine, bad, reason, capsys):
    class Broken(Teacher):
        async def generate_response(self, instance_id, messages, **kwargs):
            if bad == "raise":
                raise RuntimeError("down")
            return "Correct!"

    rollout, chat = make_rollout(tiny, teacher_forced_engine, lambda ctx: ANSWER, tools={}, max_len=64)
    out = rollout.generate_sequences(with_interaction(rollout, Broken({"name": "teacher"}), prompts_for(rollout, chat)))
    assert out.non_tensor_batch["finish_reason"][0] == "failed"
    assert out.batch["response_mask"].sum() == 0  # not trained on
    assert reason in capsys.readouterr().err


def test_the_yaml_loads_verls_format(tmp_path):
    path = tmp_path / "interactions.yaml"
    path.write_text("interaction:\n  - class_name: verl.interactions.gsm8k_interaction.Gsm8kInteraction\n"
                    "    config: {}\n  - name: tutor\n    class_name: rlvr.tools.interaction.Gsm8kInteraction\n")
    loaded = load_interactions(str(path))
    assert sorted(loaded) == ["gsm8k", "tutor"]  # verl's default name: the class name less Interaction
    assert isinstance(loaded["gsm8k"], Gsm8kInteraction) and loaded["tutor"].name == "tutor"
    assert default_name("my.mod.Judge") == "judge"
    path.write_text("interaction:\n  - class_name: rlvr.tools.interaction.Gsm8kInteraction\n"
                    "  - name: gsm8k\n    class_name: rlvr.tools.interaction.Gsm8kInteraction\n")
    with pytest.raises(ToolConfigError, match="entry 1: a second interaction named 'gsm8k'"):
        load_interactions(str(path))
    path.write_text("interaction:\n  - class_name: rlvr.tools.calculator.CalculatorTool\n")
    with pytest.raises(ToolConfigError, match="entry 0: 'rlvr.tools.calculator.CalculatorTool' is not a BaseInteraction"):
        load_interactions(str(path))


def test_gsm8k_interaction_answers_as_verls():
    gsm = Gsm8kInteraction({"name": "gsm8k"})

    async def episode():
        iid = await gsm.start_interaction("r1", ground_truth="72", query="q")
        wrong = await gsm.generate_response(iid, [{"role": "assistant", "content": "#### 71"}])
        right = await gsm.generate_response(iid, [{"role": "assistant", "content": "So #### 72"}])
        await gsm.finalize_interaction(iid)
        return wrong, right, dict(gsm.instances)

    wrong, right, left = asyncio.run(episode())
    assert wrong[0] is False and wrong[2] == 0.0 and "try again" in wrong[1]
    assert right == (True, "Your response is correct!", 1.0, {}) and left == {}


def test_config_reads_verls_keys_and_refuses_what_cannot_run(tmp_path):
    path = tmp_path / "i.yaml"
    path.write_text("interaction:\n  - name: gsm8k\n    class_name: rlvr.tools.interaction.Gsm8kInteraction\n")
    cfg = load_config(None, ["actor_rollout_ref.rollout.multi_turn.enable=true", "data.return_raw_chat=true",
                             f"actor_rollout_ref.rollout.multi_turn.interaction_config_path={path}",
                             "actor_rollout_ref.rollout.multi_turn.max_user_turns=5"])
    mt = cfg.actor_rollout_ref.rollout.multi_turn
    assert mt.interaction_config_path == str(path) and mt.max_user_turns == 5 and mt.tool_config_path is None
    with pytest.raises(ConfigError, match="interaction_config_path is set but .*enable=false"):
        load_config(None, [f"actor_rollout_ref.rollout.multi_turn.interaction_config_path={path}"])
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(None, ["actor_rollout_ref.rollout.multi_turn.enable=true", "data.return_raw_chat=true",
                           "actor_rollout_ref.rollout.multi_turn.interaction_config_path=nowhere.yaml"])
    with pytest.raises(ConfigError, match="max_user_turns = 0 must be >= 1"):
        load_config(None, ["actor_rollout_ref.rollout.multi_turn.max_user_turns=0"])

