"""Countdown (TinyZero): the equation in ``<answer>..</answer>`` must use each given number
exactly once and equal the target. Score: 1 correct, ``format_score`` for a well-formed but
wrong equation, 0 without an answer."""

from __future__ import annotations

import re

from rlvr.data.tasks.arithmetic import evaluate

_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.S)
_ALLOWED = re.compile(r"^[\d+\-*/().\s]+$")


def extract_equation(solution_str: str) -> str | None:
    found = _ANSWER.findall(solution_str)
    return found[-1].strip() if found else None


def compute_score(data_source, solution_str, ground_truth, extra_info=None, format_score: float = 0.1) -> dict:
    target, numbers = int(ground_truth["target"]), sorted(int(n) for n in ground_truth["numbers"])
    equation = extract_equation(solution_str)
    if equation is None:
        return {"score": 0.0, "acc": 0.0}
    if "=" in equation:
        equation = equation.split("=")[0]  # "3 + 4 = 7" -> the left side
    used = sorted(int(n) for n in re.findall(r"\d+", equation))
    if not _ALLOWED.match(equation) or used != numbers:
        return {"score": format_score, "acc": 0.0}
    try:
        value = evaluate(equation)
    except (ValueError, SyntaxError, ZeroDivisionError):
        return {"score": format_score, "acc": 0.0}
    correct = abs(float(value) - target) < 1e-6
    return {"score": 1.0 if correct else format_score, "acc": float(correct)}
