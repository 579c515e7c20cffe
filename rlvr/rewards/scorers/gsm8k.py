"""GSM8K: the final answer after ``####`` (strict) or the last number (flexible), as verl scores it.

Commas in numbers (``1,234``), signs, ``$`` and a trailing period are handled; numbers
compare numerically, so ``72.0`` equals ``72``.
"""

from __future__ import annotations

import re

_NUMBER = r"-?[$]?\d[\d,]*(?:\.\d+)?"
_STRICT = re.compile(r"####\s*(" + _NUMBER + ")")
_ANY = re.compile(_NUMBER)


def _normalize(number: str) -> str:
    return number.replace(",", "").replace("$", "").rstrip(".")


def extract_solution(solution_str: str, method: str = "strict") -> str | None:
    """``strict``: the number after the last ``####``; ``flexible``: the last number in the text."""
    if method == "strict":
        found = _STRICT.findall(solution_str)
    elif method == "flexible":
        found = _ANY.findall(solution_str)
    else:
        raise ValueError(f"method must be 'strict' or 'flexible', got {method!r}")
    return _normalize(found[-1]) if found else None


def _same_number(a: str, b: str) -> bool:
    try:
        return abs(float(a) - float(b)) < 1e-6
    except ValueError:
        return a.strip() == b.strip()


def compute_score(data_source, solution_str, ground_truth, extra_info=None, method: str = "strict",
                  format_score: float = 0.0, score: float = 1.0) -> float:
    """``score`` for the right answer, ``format_score`` for a wrong one in the right format, else 0."""
    answer = extract_solution(solution_str, method)
    if answer is None:
        return 0.0
    return score if _same_number(answer, _normalize(str(ground_truth))) else format_score


def compute_score_flexible(data_source, solution_str, ground_truth, extra_info=None) -> float:
    return compute_score(data_source, solution_str, ground_truth, extra_info, method="flexible")
