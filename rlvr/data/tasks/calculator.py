"""The built-in tool task: arithmetic too long to do in one's head, easy with a calculator.

Each problem is ``a * b + c`` with a 3-digit ``a``, a 2-digit ``b`` and a 3-digit ``c``
(e.g. ``347 * 28 + 915``): SmolLM2-135M gets almost none right on its own, but copying the
expression into the calculator and its result into the answer solves it. The system prompt
and one worked example (as conversation turns) show a call in the ``tag`` format; each row carries ``tools_kwargs`` for the
calculator, as verl's tool datasets do. ``with_tool=False`` writes the same problems without
the tool instructions, the baseline the README compares against.
"""

from __future__ import annotations

import random
from typing import Any

DATA_SOURCE = "arithmetic_tool"
SYSTEM_PROMPT = (
    "You are a careful assistant with a calculator. To compute something, write the expression between "
    "<calculator> and </calculator> and wait: the result comes back in a tool message. Then state the final answer."
)
# one worked call, as turns of the conversation (a 135M model follows an example in its own format far
# more often than one described in prose)
EXAMPLE = [
    {"role": "user", "content": "What is 512 * 37 + 208?"},
    {"role": "assistant", "content": "<calculator>512 * 37 + 208</calculator>"},
    {"role": "tool", "content": "19152"},
    {"role": "assistant", "content": "The answer is 19152."},
]
QUESTION = "What is {expression}?"
NO_TOOL_QUESTION = "What is {expression}? Give the final answer as a single number."


def make_problem(rng: random.Random) -> tuple[str, int]:
    a, b, c = rng.randint(100, 999), rng.randint(10, 99), rng.randint(100, 999)
    return f"{a} * {b} + {c}", a * b + c


def make_rows(n: int, split: str, rng: random.Random, seen: set[str], with_tool: bool = True) -> list[dict[str, Any]]:
    rows = []
    while len(rows) < n:
        expression, answer = make_problem(rng)
        if expression in seen:
            continue
        seen.add(expression)
        if with_tool:
            prompt = [{"role": "system", "content": SYSTEM_PROMPT}, *EXAMPLE,
                      {"role": "user", "content": QUESTION.format(expression=expression)}]
        else:
            prompt = [{"role": "user", "content": NO_TOOL_QUESTION.format(expression=expression)}]
        extra = {"index": len(rows), "split": split, "expression": expression}
        if with_tool:
            extra["tools_kwargs"] = {"calculator": {"create_kwargs": {"ground_truth": str(answer)}}}
        rows.append({"data_source": DATA_SOURCE if with_tool else "arithmetic", "prompt": prompt, "ability": "math",
                     "reward_model": {"style": "rule", "ground_truth": str(answer)}, "extra_info": extra})
    return rows


def make_splits(n_train: int, n_test: int, seed: int = 0, with_tool: bool = True) -> dict[str, list[dict[str, Any]]]:
    """Disjoint train and test problems, reproducible from ``seed`` (the same problems with or without the tool)."""
    rng, seen = random.Random(f"calculator-{seed}"), set()
    test = make_rows(n_test, "test", rng, seen, with_tool)
    return {"train": make_rows(n_train, "train", rng, seen, with_tool), "test": test}
