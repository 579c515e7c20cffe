"""The tool task's scorer reads the model's final turn, never a tool's output."""

from rlvr.rewards.scorers.tool_answer import compute_score


def turns(*pairs):
    return [{"role": role, "content": content} for role, content in pairs]


def test_final_assistant_turn_is_scored():
    done = turns(("assistant", "<calculator>2+3</calculator>"), ("tool", "5"), ("assistant", "The answer is 5."))
    assert compute_score("arithmetic_tool", "ignored", "5", {"messages": done}) == \
        {"score": 1.0, "used_tool": 1.0, "correct_with_tool": 1.0}


def test_a_trajectory_ending_on_a_call_or_a_tool_result_scores_zero():
    # the last number in the whole text is the tool's (correct) result, but the model never answered
    on_call = turns(("assistant", "<calculator>2+3</calculator>"))
    on_result = turns(("assistant", "<calculator>2+3</calculator>"), ("tool", "5"))
    for messages in (on_call, on_result):
        assert compute_score("arithmetic_tool", "<calculator>2+3</calculator> tool 5", "5",
                             {"messages": messages})["score"] == 0.0


def test_an_answer_without_the_tool_counts_but_not_as_tool_use():
    assert compute_score("arithmetic_tool", "", "5", {"messages": turns(("assistant", "It is 5."))}) == \
        {"score": 1.0, "used_tool": 0.0, "correct_with_tool": 0.0}
    assert compute_score("arithmetic_tool", "The answer is 5.", "5")["score"] == 1.0  # single-turn: the text
