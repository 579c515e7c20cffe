"""Scorer of the built-in arithmetic task: 1.0 when the response's final number is exact.

The final number is the one inside an explicit answer marker when the response has one
(``<answer>..</answer>``, ``\\boxed{..}``, ``#### ..``, "answer is ..") and otherwise the
last number in the response, so a model is rewarded for the answer it settles on, not for
a number it mentions on the way.
"""

from __future__ import annotations

import re

_NUMBER = r"-?\d[\d,]*(?:\.\d+)?"
_MARKERS = [
    re.compile(r"<answer>\s*(" + _NUMBER + r")\s*</answer>", re.S),
    re.compile(r"\\boxed\{\s*(" + _NUMBER + r")\s*\}"),
    re.compile(r"####\s*(" + _NUMBER + ")"),
    re.compile(r"answer\s*(?:is|:)\s*\$?(" + _NUMBER + ")", re.I),
]


def extract_final_number(text: str) -> str | None:
    """The answer a response settles on, as a string without thousands separators, or None."""
    for pattern in _MARKERS:
        found = pattern.findall(text)
        if found:
            return found[-1].replace(",", "")
    found = re.findall(_NUMBER, text)
    return found[-1].replace(",", "").rstrip(".") if found else None


def compute_score(data_source: str, solution_str: str, ground_truth: str, extra_info: dict | None = None) -> float:
    answer = extract_final_number(solution_str)
    if answer is None:
        return 0.0
    try:
        return 1.0 if float(answer) == float(ground_truth) else 0.0
    except ValueError:
        return 0.0
