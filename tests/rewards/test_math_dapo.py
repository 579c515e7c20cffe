"""verl's DAPO math scorer (``math_dapo``): the last ``Answer:`` of the response's last 300
characters, Minerva-normalised, against the normalised ground truth; +1 right, -1 wrong. verl
sends data sources math, math_dapo, math_dapo_reasoning and every aime* to it, and the MATH
data sets to its 1/0 math scorer (rlvr's math-verify one)."""

import pytest

from rlvr.rewards import get_scorer
from rlvr.rewards.registry import reward_fn_name_for
from rlvr.rewards.scorers import math_dapo


@pytest.mark.parametrize("response, truth, score, pred", [
    ("2 * 6 = 12.\nAnswer: 12", "12", 1.0, "12"),
    ("2 * 6 = 13.\nAnswer: 13", "12", -1.0, "13"),
    ("Answer: \\boxed{12}", "12", 1.0, "12"),                # \boxed{...} unwrapped
    ("answer:   $12$", "12", 1.0, "12"),                      # any case; the $...$ span, its $ dropped
    ("Answer: 12 dollars", "12", 1.0, "12"),                  # a unit word removed, then the space
    ("Answer: x = 12", "12", 1.0, "12"),                      # the right side of the last "="
    ("Answer: 1,000", "1000", 1.0, "1000"),                   # thousands commas of a whole number
    ("Answer: \\frac12", "\\frac{1}{2}", 1.0, "\\frac{1}{2}"),  # shorthand \fracab is \frac{a}{b}
    ("Answer: 13\nno, wait.\nAnswer: 12", "12", 1.0, "12"),  # the last Answer: counts
    ("The result is \\boxed{12}.", "12", -1.0, "[INVALID]"),  # no Answer: line at all
    ("Answer: 12.", "12", -1.0, "12."),                       # verl keeps a final "." (only ".$" loses it)
])
def test_hand_checked_answers(response, truth, score, pred):
    result = math_dapo.compute_score("math_dapo", response, truth)
    assert result == {"score": score, "acc": float(score > 0), "pred": pred}


def test_only_the_last_300_characters_are_read():
    # "Answer: 12\n" is 11 characters: with 289 after it the response is 300 long and read whole;
    # with 290 after it the window starts at its "n" ("nswer: 12"), and no Answer: is left
    inside = "Answer: 12\n" + "x" * 289
    outside = "Answer: 12\n" + "x" * 290
    assert len(inside) == 300 and len(outside) == 301
    assert math_dapo.compute_score("aime2024", inside, "12")["score"] == 1.0
    assert math_dapo.compute_score("aime2024", outside, "12")["score"] == -1.0


@pytest.mark.parametrize("source", ["math_dapo", "math", "math_dapo_reasoning", "aime", "aime2024", "aime25",
                                    "aime_2025_I"])
def test_verls_dapo_data_sources_go_to_math_dapo(source):
    assert reward_fn_name_for(source) == "math_dapo"
    assert get_scorer(source) is math_dapo.compute_score


@pytest.mark.parametrize("source", ["lighteval/MATH", "DigitalLearningGmbH/MATH-lighteval", "HuggingFaceH4/MATH-500"])
def test_the_math_data_sets_keep_the_1_0_math_scorer(source):
    assert reward_fn_name_for(source) == "math"
    assert get_scorer(source)(source, "so $\\boxed{12}$", "13")["score"] == 0.0  # wrong is 0, not -1


def test_an_unknown_source_lists_the_prefix():
    with pytest.raises(KeyError, match=r"known data sources: .*'aime\*'"):
        reward_fn_name_for("nope")
