import pytest

from rlvr.rewards import get_scorer
from rlvr.rewards.scorers.arithmetic import compute_score, extract_final_number


@pytest.mark.parametrize(
    "text, expected",
    [
        ("16 * 7 = 112", "112"),
        ("3 - 17 = -14", "-14"),
        ("The answer is 42. I counted 3 times.", "42"),  # explicit marker beats the last number
        ("<answer> 1,234 </answer> (checked 2 ways)", "1234"),
        ("so \\boxed{-5} and 8", "-5"),
        ("#### 72", "72"),
        ("no digits here", None),
        ("it is 12.", "12"),
    ],
)
def test_extract_final_number(text, expected):
    assert extract_final_number(text) == expected


def test_compute_score():
    assert compute_score("arithmetic", "8 + 5 = 13", "13") == 1.0
    assert compute_score("arithmetic", "8 + 5 = 12", "13") == 0.0
    assert compute_score("arithmetic", "I don't know", "13") == 0.0


def test_unknown_data_source_names_known_ones():
    assert get_scorer("arithmetic") is compute_score
    with pytest.raises(KeyError, match=r"no reward function for data_source 'nope'; known data sources: .*'arithmetic'.*'openai/gsm8k'"):
        get_scorer("nope")


@pytest.mark.parametrize("text, truth, expected", [
    ("999999998000000000", "999999998000000001", 0.0),  # 999999999^2 = 999999998000000001; equal as floats
    ("9" * 400, "9" * 401, 0.0),                         # both were inf as floats, and matched
    ("12.0", "12", 1.0),                                 # one number, two spellings
    ("-0", "0", 1.0),
    ("1,000", "1000", 1.0),
    ("1,2,3", "123", 0.0),                               # not thousands groups: the last number is 3
    ("1,2,3", "3", 1.0),
    ("#### 1,234,567", "1234567", 1.0),
])
def test_numbers_compare_exactly(text, truth, expected):
    assert compute_score("arithmetic", text, truth) == expected


def test_commas_separate_thousands_only():
    assert extract_final_number("1,2,3") == "3"
    assert extract_final_number("12,34") == "34"
    assert extract_final_number("1,2345") == "2345"
    assert extract_final_number("it is 1,234.5 now") == "1234.5"
