"""Scorers on real-format answers: GSM8K markers with commas, signs and decimals; answers
inside and outside tags; boxed LaTeX (fractions, roots, equivalent forms)."""

import pytest

from rlvr.rewards.scorers import countdown, format, gsm8k, math


@pytest.mark.parametrize("text, truth, strict, flexible", [
    ("She pays 1,234 + 66 = $1,300 in total.\n#### 1,300", "1300", 1.0, 1.0),
    ("The temperature drops to -12 degrees.\n#### -12", "-12", 1.0, 1.0),
    ("Each costs 2.50, so 4 cost 10.\n#### 10.00", "10", 1.0, 1.0),   # 10.00 == 10 numerically
    ("Half of 7 is 3.5\n#### 3.5", "3.5", 1.0, 1.0),
    ("#### 72\nWait, I mean 73.", "72", 1.0, 0.0),                   # flexible takes the last number
    ("The answer is 72.", "72", 0.0, 1.0),                           # strict needs the #### marker
    ("#### 1,234,567", "1234567", 1.0, 1.0),
    ("no number at all", "5", 0.0, 0.0),
])
def test_gsm8k_real_formats(text, truth, strict, flexible):
    assert gsm8k.compute_score("openai/gsm8k", text, truth) == strict
    assert gsm8k.compute_score_flexible("openai/gsm8k", text, truth) == flexible


def test_gsm8k_searches_the_last_300_characters_for_ascii_digits_as_verl():
    # verl's extract_solution clips to solution_str[-300:] and matches [0-9]: an answer followed by
    # 301 characters of ramble is not found; Arabic-Indic digits are no number
    ramble = " and so on" * 31  # 310 characters
    assert gsm8k.compute_score("gsm8k", "#### 72" + ramble, "72") == 0.0
    assert gsm8k.compute_score("gsm8k", "#### 72" + ramble[:290], "72") == 1.0  # 7 + 290 = 297 characters
    assert gsm8k.compute_score_flexible("gsm8k", "it is 72" + ramble, "72") == 0.0
    assert gsm8k.compute_score("gsm8k", "#### \u0667\u0662", "72") == 0.0  # "٧٢"


def test_gsm8k_format_score_for_a_wrong_answer_in_the_right_format():
    assert gsm8k.compute_score("gsm8k", "#### 5", "6", format_score=0.1) == 0.1
    assert gsm8k.compute_score("gsm8k", "5", "6", format_score=0.1) == 0.0  # no marker: no format credit


@pytest.mark.parametrize("text, truth, expected", [
    ("Thus $\\boxed{\\frac{3}{4}}$.", "0.75", 1.0),
    ("Thus $\\boxed{\\dfrac{5}{8}}$.", "\\frac{5}{8}", 1.0),
    ("The side is $\\boxed{2\\sqrt{3}}$.", "\\sqrt{12}", 1.0),       # equal values, different forms
    ("We get $\\boxed{-\\frac{1}{2}}$", "-0.5", 1.0),
    ("So $x = \\boxed{1+x^2}$", "x^2+1", 1.0),
    ("Thus $\\boxed{\\frac{3}{5}}$.", "0.75", 0.0),
])
def test_math_verify_latex(text, truth, expected):
    assert math.compute_score("math", text, truth)["score"] == expected


def test_answers_inside_and_outside_tags():
    tagged = "<think>7 * 6 is 42</think><answer>42</answer>"
    assert format.correctness("x", tagged, "42") == 2.0
    assert format.correctness("x", "<think>it is 42</think> 42", "42") == 0.0  # outside the tag: not an answer
    assert format.digit("x", tagged, "42") == 0.5 and format.digit("x", "<answer>forty</answer>", "42") == 0.0
    assert format.hard_format("x", tagged, "42") == 0.5
    assert format.hard_format("x", "Sure! " + tagged, "42") == 0.0  # text outside the blocks breaks hard format
    assert format.soft_format("x", "Sure! " + tagged, "42") == 0.5
    assert format.mark("x", tagged + "</answer>", "42") == 0.375  # </answer> twice: 3 of 4 tags count
    gt = {"target": 24, "numbers": [4, 6, 1]}
    assert countdown.compute_score("countdown", "<think>4*6=24</think><answer>4 * 6 * 1</answer>", gt)["score"] == 1.0
    assert countdown.compute_score("countdown", "4 * 6 * 1 = 24", gt)["score"] == 0.0  # no answer tag


def test_a_gold_answer_with_an_escaped_dollar_is_parsed_as_latex():
    """Failed before the fix: a gold ``\\$32`` has a "$", so it was not wrapped in $...$ as LaTeX,
    math-verify could not parse it, and every sample of the row raised (counted as an error)."""
    assert math.compute_score("math", "The price is $\\boxed{\\$32}$.", "\\$32")["score"] == 1.0
    assert math.compute_score("math", "The price is $\\boxed{\\$33}$.", "\\$32")["score"] == 0.0
    assert math.compute_score("math", "so $\\boxed{5}$", "$5$")["score"] == 1.0  # delimited gold: as before


@pytest.mark.parametrize("text, truth, strict", [
    ("#### 12", "12.0000001", 0.0),      # differs in the 7th decimal: within the old 1e-6 tolerance
    ("#### 1000000.0000001", "1000000", 0.0),
    ("#### 12345678901234567891", "12345678901234567890", 0.0),  # equal as floats (1.2345678901234567e19)
    ("#### 12.0", "12", 1.0),            # the same number written two ways
    ("#### 1,2,3", "123", 0.0),          # "1,2,3" is no number with thousands separators: "1" is read
    ("#### 1,234", "1234", 1.0),
    ("#### 12", "1,2", 0.0),             # a ground truth is read by the same rule
])
def test_gsm8k_compares_numbers_exactly(text, truth, strict):
    assert gsm8k.compute_score("openai/gsm8k", text, truth) == strict


def generated_truths(tmp_path) -> dict[str, list]:
    """Scorer name -> the ground truths that ``rlvr prepare`` writes for it, read back from its parquet
    files as a dataset loads them; MATH ships no generator, so its answers are typical ones."""
    from rlvr.data.io import read_rows
    from rlvr.data.prepare import prepare_arithmetic, prepare_calculator, prepare_countdown, prepare_gsm8k
    from rlvr.rewards.registry import reward_fn_name_for

    raw = tmp_path / "gsm8k_raw" / "train.jsonl"
    raw.parent.mkdir()
    raw.write_text('{"question": "How many?", "answer": "12 * 100 + 34 = 1234\\n#### 1,234"}\n')
    files = [prepare_arithmetic(tmp_path / "arithmetic", 8, 4)["train"],
             prepare_calculator(tmp_path / "calculator", 8, 4)["train"],
             prepare_countdown(tmp_path / "countdown", 8, 4)["train"],
             prepare_gsm8k(tmp_path / "gsm8k", raw.parent)["train"]]
    truths: dict[str, list] = {}
    for row in (row for path in files for row in read_rows(path)):
        truths.setdefault(reward_fn_name_for(row["data_source"]), []).append(row["reward_model"]["ground_truth"])
    truths["gsm8k_flexible"] = truths["correctness"] = truths["gsm8k"]  # GSM8K's rows, scored other ways
    truths["math"] = truths["math_dapo"] = ["\\frac{1}{2}", "3", "(1, 2]", "\\text{Monday}", "\\sqrt{2}/2"]
    return truths


def test_every_built_in_truth_check_accepts_the_ground_truth_its_task_writes(tmp_path):
    """A check stricter than its scorer would refuse a whole prepared dataset at load; each truth
    also scores without raising."""
    from rlvr.rewards.registry import REWARD_FNS, truth_check, truth_fits

    truths = generated_truths(tmp_path)
    assert set(truths) == {name for name in REWARD_FNS.names() if truth_check(name)}  # every check is covered
    for name, values in truths.items():
        for truth in values:
            assert truth_fits(name, truth), (name, truth)
            REWARD_FNS.get(name)(data_source="x", solution_str=f"Answer: {truth}", ground_truth=truth)


@pytest.mark.parametrize("truth", ["abc", "12 apples", "1e3", "", "$", "\\boxed{}", ["72"], {"answer": "7"},
                                   {"target": "x", "numbers": [4]}, {"target": 24}, {"target": 24, "numbers": 4},
                                   {"target": 24, "numbers": [4, None]}, float("nan"), float("inf"), None, True])
def test_no_truth_check_accepts_a_ground_truth_its_scorer_raises_on(truth):
    """What a check lets through must score: a row it accepts that raised would fail at every step."""
    from rlvr.rewards.registry import REWARD_FNS, truth_check, truth_fits

    for name in (name for name in REWARD_FNS.names() if truth_check(name)):
        if truth_fits(name, truth):
            REWARD_FNS.get(name)(data_source="x", solution_str="<answer>12</answer> Answer: 12", ground_truth=truth)


@pytest.mark.parametrize("name, truth", [("arithmetic", "abc"), ("tool_answer", "abc"), ("arithmetic", "1e3"),
                                         ("countdown", {"target": "x", "numbers": [4]}), ("math", "$")])
def test_a_truth_check_refuses_what_its_scorer_raises_on(name, truth):
    from rlvr.rewards.registry import REWARD_FNS, truth_fits

    with pytest.raises((ValueError, TypeError)):
        REWARD_FNS.get(name)(data_source="x", solution_str="Answer: 12", ground_truth=truth)
    assert not truth_fits(name, truth)
