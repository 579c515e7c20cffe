"""Countdown (TinyZero): the equation in ``<answer>..</answer>`` must use each given number
exactly once and equal the target. Score: 1 correct, ``format_score`` for a well-formed but
wrong equation, 0 without an answer."""

from __future__ import annotations

import re
from decimal import Decimal

from rlvr.data.tasks.arithmetic import evaluate

_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.S)
_ALLOWED = re.compile(r"^[\d+\-*/().\s]+$")


def extract_equation(solution_str: str) -> str | None:
    found = _ANSWER.findall(solution_str)
    return found[-1].strip() if found else None


def read_truth(ground_truth) -> tuple[int, list[int]]:
    """The target and the sorted numbers of ``{"target": 24, "numbers": [4, 6, ...]}``."""
    return int(ground_truth["target"]), sorted(int(n) for n in ground_truth["numbers"])


def truth_fits(ground_truth) -> bool:
    """``compute_score`` can score against ``ground_truth``: a mapping whose target and numbers read as integers."""
    if not isinstance(ground_truth, dict):
        return False
    try:
        read_truth(ground_truth)
    except (KeyError, TypeError, ValueError, OverflowError):  # a key missing, None, "x", a number not iterable, inf
        return False
    return True


def compute_score(data_source, solution_str, ground_truth, extra_info=None, format_score: float = 0.1) -> dict:
    target, numbers = read_truth(ground_truth)
    equation = extract_equation(solution_str)
    if equation is None:
        return {"score": 0.0, "acc": 0.0}
    if "=" in equation:
        equation = equation.split("=")[0]  # "3 + 4 = 7" -> the left side
    # through Decimal: int(str) refuses more than 4300 digits, which a model in a repetition loop writes
    used = sorted(int(Decimal(n)) for n in re.findall(r"\d+", equation))
    if not _ALLOWED.match(equation) or used != numbers:
        return {"score": format_score, "acc": 0.0}
    try:
        value = evaluate(equation)
    # RecursionError, MemoryError: deeper than Python's parser goes ("-" * 4000 + "2"), TinyZero's eval too
    except (ValueError, SyntaxError, ZeroDivisionError, RecursionError, MemoryError):
        return {"score": format_score, "acc": 0.0}
    correct = abs(float(value) - target) < 1e-6
    return {"score": 1.0 if correct else format_score, "acc": float(correct)}
