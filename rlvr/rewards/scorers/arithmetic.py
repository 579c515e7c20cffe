"""Scorer of the built-in arithmetic task: 1.0 when the response's final number is exact.

The final number is the one inside an explicit answer marker when the response has one
(``<answer>..</answer>``, ``\\boxed{..}``, ``#### ..``, "answer is ..") and otherwise the
last number in the response, so a model is rewarded for the answer it settles on, not for
a number it mentions on the way. Numbers compare exactly, as fractions (``12.0`` equals
``12``; two 20-digit numbers that one float would hold equal do not), and a comma is a
thousands separator only between groups of exactly three digits (``1,234``; ``1,2,3`` is
three numbers).
"""

from __future__ import annotations

import re
from decimal import Decimal
from fractions import Fraction

DIGITS = r"(?:[0-9]{1,3}(?:,[0-9]{3})+(?![0-9])|[0-9]+)(?:\.[0-9]+)?"
"""An unsigned decimal number, its whole part plain or in comma-separated thousands; ASCII digits
(``\\d`` would read Arabic-Indic or fullwidth digits as numbers, which verl's ``[0-9]`` does not)."""
_NUMBER = r"-?" + DIGITS
_MARKERS = [
    re.compile(r"<answer>\s*(" + _NUMBER + r")\s*</answer>", re.S),
    re.compile(r"\\boxed\{\s*(" + _NUMBER + r")\s*\}"),
    re.compile(r"####\s*(" + _NUMBER + ")"),
    re.compile(r"answer\s*(?:is|:)\s*\$?(" + _NUMBER + ")", re.I),
]


def as_number(text) -> Fraction | None:
    """``text`` as an exact number (``"1,234.5"`` -> 2469/2), or None when it is not one number."""
    text = str(text).strip()
    if not re.fullmatch(_NUMBER, text):
        return None
    # through Decimal: Fraction(str) goes through int(str), which refuses more than 4300 digits, and a
    # model in a repetition loop writes that many (the number is then wrong, not a scorer's error)
    return Fraction(Decimal(text.replace(",", "")))


def truth_fits(ground_truth) -> bool:
    """``compute_score`` can score against ``ground_truth``: it is one number."""
    return as_number(ground_truth) is not None


def extract_final_number(text: str) -> str | None:
    """The answer a response settles on, as a string without thousands separators, or None."""
    for pattern in _MARKERS:
        found = pattern.findall(text)
        if found:
            return found[-1].replace(",", "")
    found = re.findall(_NUMBER, text)
    return found[-1].replace(",", "") if found else None


def compute_score(data_source: str, solution_str: str, ground_truth: str, extra_info: dict | None = None) -> float:
    truth = as_number(ground_truth)
    if truth is None:  # every sample of the row would score 0, whatever it answers
        raise ValueError(f"the ground truth {ground_truth!r} is not a number")
    answer = extract_final_number(solution_str)
    return 0.0 if answer is None else float(as_number(answer) == truth)
