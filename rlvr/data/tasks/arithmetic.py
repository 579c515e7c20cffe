"""The built-in arithmetic task: seeded integer problems with exact answers.

Difficulty knobs: ``digits`` (largest operand has this many digits), ``max_operand`` (a
finer cap), ``operators`` (any of ``+-*/``; division is always exact) and ``num_operands``. An expression is a sum of terms;
a term is a number, a product ``a * b`` or an exact quotient ``a / b``, so the answer is
always an integer and standard precedence gives it.
"""

from __future__ import annotations

import ast
import operator
import random
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

DATA_SOURCE = "arithmetic"
PROMPT_TEMPLATE = "What is {expression}? Give the final answer as a single number."

_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: Fraction}


@dataclass(frozen=True)
class ArithmeticSpec:
    digits: int = 2
    """Digits of the largest operand (1 -> 0..9, 2 -> 0..99)."""
    operators: str = "+-*"
    """Operators to draw from: any of + - * /."""
    num_operands: int = 2
    """Numbers per expression (>= 2)."""
    max_operand: int | None = 20
    """Largest operand, a cap on ``digits``' bound (``digits`` must be reachable under it); None
    means the largest number with ``digits`` digits.
    The default (0..20, + - *) leaves SmolLM2-135M-Instruct about 38% greedy accuracy: room to learn."""

    def __post_init__(self) -> None:
        if self.digits < 1:
            raise ValueError(f"digits must be >= 1, got {self.digits}")
        if not self.operators or set(self.operators) - set("+-*/"):
            raise ValueError(f"operators must be a non-empty subset of '+-*/', got {self.operators!r}")
        if self.max_operand is not None and self.max_operand < 1:
            raise ValueError(f"max_operand must be >= 1, got {self.max_operand}")
        if self.num_operands < 2:
            raise ValueError(f"num_operands must be >= 2, got {self.num_operands}")
        if self.max_operand is not None and self.digits > len(str(self.max_operand)):  # it would change nothing
            raise ValueError(f"digits must be <= {len(str(self.max_operand))} under max_operand={self.max_operand} "
                             f"(no {self.digits}-digit operand is that small), got {self.digits}; raise the largest "
                             "operand, or lift it (--max-operand 0, max_operand=None) to bound operands by digits")

    @property
    def largest(self) -> int:
        """The largest operand: ``digits`` digits, capped at ``max_operand``."""
        by_digits = 10 ** self.digits - 1
        return by_digits if self.max_operand is None else min(self.max_operand, by_digits)


def evaluate(expression: str) -> Fraction:
    """Exact value of an expression of integers and + - * / (no eval of arbitrary code)."""

    def walk(node: ast.AST) -> Fraction:
        if isinstance(node, ast.Expression):
            return walk(node.body)
        if isinstance(node, ast.Constant) and isinstance(node.value, int):
            return Fraction(node.value)
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return -walk(node.operand)
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            left, right = walk(node.left), walk(node.right)
            return left / right if isinstance(node.op, ast.Div) else _OPS[type(node.op)](left, right)
        raise ValueError(f"unsupported expression element {ast.dump(node)}")

    return walk(ast.parse(expression, mode="eval"))


def _quotient(rng: random.Random, hi: int) -> str:
    """An exact quotient ``a / b`` with ``a`` at most about ``hi``."""
    divisor = rng.randint(1, max(1, min(hi, 12)))
    return f"{divisor * rng.randint(0, max(1, hi // divisor))} / {divisor}"


def make_problem(rng: random.Random, spec: ArithmeticSpec) -> tuple[str, int]:
    """A random expression and its integer value."""
    hi = spec.largest
    parts = [str(rng.randint(0, hi))]
    count = 1
    while count < spec.num_operands:
        op = rng.choice(spec.operators)
        if op == "/":  # a quotient is a whole term: prefix it with + or -
            sign = rng.choice("+-")
            parts.append(f"{sign} {_quotient(rng, hi)}")
        else:
            parts.append(f"{op} {rng.randint(0, hi)}")
        count += 1
    expression = " ".join(parts)
    value = evaluate(expression)
    assert value.denominator == 1, expression  # division is constructed to be exact
    return expression, int(value)


def make_splits(n_train: int, n_test: int, seed: int = 0, spec: ArithmeticSpec = ArithmeticSpec(),
                template: str = PROMPT_TEMPLATE) -> dict[str, list[dict[str, Any]]]:
    """Disjoint train and test problems (no expression in both), reproducible from ``seed``."""
    rng = random.Random(f"arithmetic-{seed}")
    seen: set[str] = set()
    splits: dict[str, list[tuple[str, int]]] = {"test": [], "train": []}
    for split, n in (("test", n_test), ("train", n_train)):
        attempts = 0
        while len(splits[split]) < n:
            expression, answer = make_problem(rng, spec)
            attempts += 1
            if expression not in seen:
                seen.add(expression)
                splits[split].append((expression, answer))
            elif attempts > 50 * (n_train + n_test):
                raise ValueError(
                    f"only {len(seen)} distinct problems found for {spec}; ask for fewer rows "
                    "or raise digits / num_operands"
                )
    return {split: to_rows(problems, split, template) for split, problems in splits.items()}


def to_rows(problems: list[tuple[str, int]], split: str, template: str = PROMPT_TEMPLATE) -> list[dict[str, Any]]:
    """(expression, answer) pairs in verl's row format."""
    rows = []
    for i, (expression, answer) in enumerate(problems):
        rows.append({
            "data_source": DATA_SOURCE,
            "prompt": [{"role": "user", "content": template.format(expression=expression)}],
            "ability": "math",
            "reward_model": {"style": "rule", "ground_truth": str(answer)},
            "extra_info": {"index": i, "split": split, "expression": expression},
        })
    return rows
