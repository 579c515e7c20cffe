"""Countdown (TinyZero's task): reach a target from given numbers with + - * /.

Each problem is built from a random solution, so every problem is solvable: 3 or 4
numbers in [1, max_number] are combined in a random order with random operators, keeping
every intermediate result a positive integer; the result is the target.
"""

from __future__ import annotations

import random
from typing import Any

DATA_SOURCE = "countdown"
PROMPT_TEMPLATE = (
    "Using the numbers {numbers}, write an equation that equals {target}. You may use + - * / and "
    "parentheses, and must use each number exactly once. Think inside <think> </think> tags, then give "
    "only the equation inside <answer> </answer> tags, for example <answer> (1 + 2) * 3 </answer>."
)


def make_problem(rng: random.Random, min_count: int = 3, max_count: int = 4, max_number: int = 99,
                 max_target: int = 999) -> tuple[list[int], int, str]:
    """Numbers, target and one solution expression."""
    while True:
        numbers = [rng.randint(1, max_number) for _ in range(rng.randint(min_count, max_count))]
        order = numbers[:]
        rng.shuffle(order)
        value, expression = order[0], str(order[0])
        for n in order[1:]:
            candidates = [("+", value + n), ("*", value * n)]
            if value - n > 0:
                candidates.append(("-", value - n))
            if value % n == 0:
                candidates.append(("/", value // n))
            op, value = rng.choice(candidates)
            expression = f"({expression} {op} {n})"
        if 1 <= value <= max_target:
            return numbers, value, expression[1:-1] if expression.startswith("(") else expression


def make_rows(n: int, seed: int, split: str, template: str = PROMPT_TEMPLATE, seen: set | None = None,
              **kwargs) -> list[dict[str, Any]]:
    """``n`` distinct problems; none of those in ``seen`` (another split's), which gains these."""
    rng = random.Random(f"countdown-{seed}-{split}")
    seen = set() if seen is None else seen
    rows = []
    for i in range(n):
        for _ in range(10_000):  # a repeat is redrawn: the same numbers and target are the same problem
            numbers, target, solution = make_problem(rng, **kwargs)
            if (problem := (tuple(sorted(numbers)), target)) not in seen:
                break
        else:
            raise ValueError(f"{split}: could not draw {n} distinct problems (10,000 draws found no new one)")
        seen.add(problem)
        rows.append({
            "data_source": DATA_SOURCE,
            "prompt": [{"role": "user", "content": template.format(numbers=numbers, target=target)}],
            "ability": "math",
            "reward_model": {"style": "rule", "ground_truth": {"target": target, "numbers": numbers}},
            "extra_info": {"index": i, "split": split, "solution": solution},
        })
    return rows
