"""GSM8K: the final answer after ``####`` (strict) or the last number (flexible), as verl scores it.

Where rlvr departs from verl's ``gsm8k.compute_score``, which compares the extracted text
(commas and ``$`` removed) with the ground truth as strings: numbers compare exactly as
numbers, so ``72.0`` and ``72.00`` equal ``72`` (verl: wrong) and ``12.0000001`` does not; a
comma counts only as a thousands separator between groups of three digits (``1,234``; verl
drops every comma, reading ``1,2,3`` as ``123``); ``####`` may be followed by any spacing
(verl: one space); ``$``, a sign and a final period are handled as verl does. As in verl, only
the response's last ``CLIP_CHARS`` characters are searched (its ``_SOLUTION_CLIP_CHARS``: an
answer followed by a long ramble is not found) and digits are ASCII (``[0-9]``).
"""

from __future__ import annotations

import re

from rlvr.rewards.scorers import one_answer
from rlvr.rewards.scorers.arithmetic import DIGITS, as_number

_NUMBER = r"-?[$]?" + DIGITS
_STRICT = re.compile(r"####\s*(" + _NUMBER + ")")
_ANY = re.compile(_NUMBER)
CLIP_CHARS = 300


def _normalize(number: str) -> str:
    return number.replace(",", "").replace("$", "").rstrip(".")


def extract_solution(solution_str: str, method: str = "strict") -> str | None:
    """``strict``: the number after the last ``####``; ``flexible``: the last number in the text;
    each in the text's last ``CLIP_CHARS`` characters."""
    solution_str = solution_str[-CLIP_CHARS:]
    if method == "strict":
        found = _STRICT.findall(solution_str)
    elif method == "flexible":
        found = _ANY.findall(solution_str)
    else:
        raise ValueError(f"method must be 'strict' or 'flexible', got {method!r}")
    return _normalize(found[-1]) if found else None


def _truth_text(ground_truth) -> str:
    return str(ground_truth).replace("$", "").strip().rstrip(".")


def truth_fits(ground_truth) -> bool:
    """``compute_score`` can score against ``ground_truth``: one number (``"72"``, ``"$1,234"``). Both
    methods only ever extract a number, so a truth that is none (the whole GSM8K solution, its
    ``#### 72`` not split off) would score 0 for every response."""
    return one_answer(ground_truth) and as_number(_truth_text(ground_truth)) is not None


def _same_number(answer: str, ground_truth) -> bool:
    """Equal as exact numbers; a ground truth that is no number is compared as text."""
    truth = _truth_text(ground_truth)
    a, b = as_number(answer), as_number(truth)
    return a == b if a is not None and b is not None else answer.strip() == truth


def compute_score(data_source, solution_str, ground_truth, extra_info=None, method: str = "strict",
                  format_score: float = 0.0, score: float = 1.0) -> float:
    """``score`` for the right answer, ``format_score`` for a wrong one in the right format, else 0."""
    answer = extract_solution(solution_str, method)
    if answer is None:
        return 0.0
    return score if _same_number(answer, ground_truth) else format_score


def compute_score_flexible(data_source, solution_str, ground_truth, extra_info=None) -> float:
    return compute_score(data_source, solution_str, ground_truth, extra_info, method="flexible")
