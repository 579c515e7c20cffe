"""What a model may write, however degenerate, is scored by the built-in scorers: never an error
(counted in reward/num_errors, a stopped run under reward.on_error=raise), never a timeout.
Repetition loops of small models are the usual source: thousands of digits in a row, tags
repeated without their closing tag."""

import re

import pytest

from rlvr.config.schema import RewardConfig, RewardFunctionEntry
from rlvr.rewards import RewardManager
from rlvr.rewards.registry import truth_fits
from rlvr.rewards.scorers import arithmetic, countdown, gsm8k, tool_answer
from rlvr.rewards.scorers import format as fmt
from tests.rewards.batches import response_batch

BIG = "9" * 5000  # beyond Python's 4300-digit limit of int(str)


@pytest.mark.parametrize("text, truth, expected", [
    ("#### " + BIG, "12", 0.0),           # a wrong answer, however long
    ("so " + BIG, "12", 0.0),             # the last number
    (BIG + " so the answer is 12", "12", 1.0),
    ("<answer>" + BIG + "</answer>", BIG, 1.0),  # a long ground truth is read too
    ("#### 1" + "0" * 5000, "1" + "0" * 4999, 0.0),  # 10**5000 is not 10**4999
])
def test_a_number_of_thousands_of_digits_is_scored(text, truth, expected):
    assert arithmetic.compute_score("arithmetic", text, truth) == expected
    assert tool_answer.compute_score("arithmetic_tool", text, truth)["score"] == expected


def test_gsm8k_scores_a_long_wrong_answer_in_the_right_format_with_format_score():
    # verl: a wrong answer after "####" scores format_score; only the last 300 characters are searched,
    # so a marker 5,000 digits back is not found (0), one 250 digits back is (0.1)
    assert gsm8k.compute_score("gsm8k", "#### " + BIG, "72", format_score=0.1) == 0.0
    assert gsm8k.compute_score("gsm8k", "#### " + "9" * 250, "72", format_score=0.1) == 0.1
    assert gsm8k.compute_score_flexible("gsm8k", "it is " + BIG, "72") == 0.0


@pytest.mark.parametrize("equation", [
    "2*3+4+" + BIG,                 # a number that is not given: TinyZero's format_score
    "-" * 4000 + "2*3+4",           # deeper than Python's parser goes (TinyZero's eval fails too)
])
def test_countdown_scores_a_degenerate_equation_with_format_score(equation):
    truth = {"target": 10, "numbers": [2, 3, 4]}
    assert countdown.compute_score("countdown", f"<answer>{equation}</answer>", truth) == {"score": 0.1, "acc": 0.0}


@pytest.mark.parametrize("text, expected", [
    ("<think>a</think> then <answer>1</answer>", 0.5),
    ("<answer>1</answer><think>a</think>", 0.0),          # out of order
    ("<think>a</think><answer>1", 0.0),                   # no closing tag
    ("<think></think><answer></answer>", 0.5),            # empty blocks count
    ("<think>a<answer>1</answer></think>", 0.0),           # nothing after </think>
    ("<think>x</think><think>y</think><answer>z</answer>", 0.5),
    ("</think><think>a</think><answer></answer>", 0.5),
])
def test_soft_format_finds_both_blocks_in_order(text, expected):
    assert fmt.soft_format("x", text, None) == expected


def test_a_repetition_loop_is_scored_not_timed_out(tokenizer):
    # a loop that never closes its last tag: before, the soft_format regex backtracked for minutes
    # (cubic in the repetitions); every function must score it, inside a generous 5 s limit each
    loop = "<think>a</think><answer>1 " * 400
    cfg = RewardConfig(functions=[RewardFunctionEntry(name) for name in
                                  ("soft_format", "hard_format", "correctness", "digit", "mark")],
                       timeout_s=5.0, on_error="raise")
    result = RewardManager(tokenizer, cfg).compute(response_batch(tokenizer, [loop]))
    assert result.metrics["reward/num_timeouts"] == 0.0
    # no block is closed by </answer>: only the tags that appear once, none, so 0
    assert result.scores.tolist() == [0.0]


def test_the_manager_scores_thousands_of_digits_under_on_error_raise(tokenizer):
    cfg = RewardConfig(on_error="raise")
    data = response_batch(tokenizer, ["#### " + BIG, BIG], ["gsm8k", "arithmetic"], ["72", "72"])
    result = RewardManager(tokenizer, cfg).compute(data)
    assert result.scores.tolist() == [0.0, 0.0] and result.metrics["reward/num_errors"] == 0.0


@pytest.mark.parametrize("truth, fits", [
    ("72", True), ("-3", True), ("1,234", True), ("$18", True), ("72.", True), (72, True),
    ("Natalia sold 48/2 = 24 clips in May.\n#### 72", False),  # the raw GSM8K answer, not extracted
    ("seventy-two", False), ("", False),
])
def test_gsm8k_refuses_a_ground_truth_no_response_can_equal(truth, fits):
    # strict and flexible extraction only ever read a number: a truth that is none scores 0 for every sample
    assert truth_fits("gsm8k", truth) is fits
    assert truth_fits("gsm8k_flexible", truth) is fits
    if fits:
        assert gsm8k.compute_score("gsm8k", f"#### {str(truth).rstrip('.')}", truth) == 1.0


def test_soft_format_equals_the_regex_it_replaced_on_short_texts():
    # the regex is the specification ("both blocks in order, anywhere"); on short texts it is fast
    import random
    import re

    spec = re.compile(r"<think>.*?</think>.*?<answer>.*?</answer>", re.S)
    pieces = ["<think>", "</think>", "<answer>", "</answer>", "x", "\n", "<", ">"]
    rng = random.Random(0)
    for _ in range(3000):
        text = "".join(rng.choice(pieces) for _ in range(rng.randint(0, 10)))
        assert fmt.soft_format("x", text, None) == (0.5 if spec.search(text) else 0.0), text


ODD_RETURNS = '''
import numpy as np

def score(data_source, solution_str, ground_truth, extra_info=None):
    if solution_str == "list":
        return [1.0]
    if solution_str == "array":
        return np.array([1.0, 2.0])
    return {"score": 1.0, "acc": np.bool_(solution_str == "right")}
'''


def test_a_numpy_bool_extra_is_averaged_like_a_bool(tmp_path, tokenizer):
    # numpy comparisons give np.bool_, which is no np.number: its mean was silently left out
    from rlvr.config.schema import CustomRewardFunctionConfig

    (tmp_path / "odd.py").write_text(ODD_RETURNS)
    cfg = RewardConfig(custom_reward_function=CustomRewardFunctionConfig(path=str(tmp_path / "odd.py"), name="score"))
    result = RewardManager(tokenizer, cfg).compute(response_batch(tokenizer, ["right", "wrong", "right", "right"]))
    assert result.metrics["reward/acc/mean"] == pytest.approx(0.75)  # 3 of 4 right


@pytest.mark.parametrize("text, shown", [("list", "[1.0] (a list)"), ("array", "array([1., 2.]) (a ndarray)")])
def test_a_score_that_is_a_container_names_the_function_and_what_it_returned(tmp_path, tokenizer, text, shown):
    from rlvr.config.schema import CustomRewardFunctionConfig
    from rlvr.rewards import RewardError

    (tmp_path / "odd.py").write_text(ODD_RETURNS)
    cfg = RewardConfig(custom_reward_function=CustomRewardFunctionConfig(path=str(tmp_path / "odd.py"), name="score"),
                       on_error="raise")
    with pytest.raises(RewardError, match=rf"reward function 'score' returned {re.escape(shown)}, not a number"):
        RewardManager(tokenizer, cfg).compute(response_batch(tokenizer, [text]))
