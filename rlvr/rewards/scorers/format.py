"""The reward functions of the seeds' small GRPO trainer (seed 002), each usable alone or
combined with weights through ``reward.functions``:

- ``correctness``: 2.0 when the text inside ``<answer>..</answer>`` equals the ground truth;
- ``digit``: 0.5 when that answer is a number;
- ``hard_format``: 0.5 when the whole response is ``<think>..</think><answer>..</answer>``;
- ``soft_format``: 0.5 when both blocks appear in order, anywhere;
- ``mark``: 0.125 for each of the four tags appearing exactly once.
"""

from __future__ import annotations

import re

_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.S)
_HARD = re.compile(r"^\s*<think>.*?</think>\s*<answer>.*?</answer>\s*$", re.S)


def extract_answer(text: str) -> str | None:
    found = _ANSWER.findall(text)
    return found[-1].strip() if found else None


def correctness(data_source, solution_str, ground_truth, extra_info=None) -> float:
    answer = extract_answer(solution_str)
    return 2.0 if answer is not None and answer == str(ground_truth).strip() else 0.0


def digit(data_source, solution_str, ground_truth, extra_info=None) -> float:
    answer = extract_answer(solution_str)
    return 0.5 if answer is not None and re.fullmatch(r"-?\d+(?:\.\d+)?", answer) else 0.0


def hard_format(data_source, solution_str, ground_truth, extra_info=None) -> float:
    return 0.5 if _HARD.match(solution_str) else 0.0


def soft_format(data_source, solution_str, ground_truth, extra_info=None) -> float:
    # each tag's first occurrence after the one before: linear, where the regex
    # <think>.*?</think>.*?<answer>.*?</answer> backtracked for minutes on a repetition loop that
    # never closes its last tag (cubic in the repetitions)
    end = 0
    for tag in ("<think>", "</think>", "<answer>", "</answer>"):
        start = solution_str.find(tag, end)
        if start < 0:
            return 0.0
        end = start + len(tag)
    return 0.5


def mark(data_source, solution_str, ground_truth, extra_info=None) -> float:
    tags = ("<think>", "</think>", "<answer>", "</answer>")
    return sum(0.125 for tag in tags if solution_str.count(tag) == 1)
