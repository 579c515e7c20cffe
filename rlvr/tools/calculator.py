"""The ``calculator`` tool: exact arithmetic by walking the expression's syntax tree.

No ``eval``: the expression is parsed with ``ast`` and only numbers, parentheses and the
operators ``+ - * / // % **`` (``x``, ``×``, ``÷`` and ``^`` are read as ``*``, ``*``, ``/``
and ``**``) are evaluated, over Python's big integers and exact fractions. A result that
is not an integer is given as a decimal when it terminates and as ``p/q`` otherwise. Sizes
are bounded (an expression of at most 500 characters, results of at most 1000 digits) so
``9**9**9`` is an error message, not a hung worker.
"""

from __future__ import annotations

import ast
import asyncio
import math
import operator
from fractions import Fraction
from typing import Any

from rlvr.tools.base import BaseTool, ToolError
from rlvr.tools.schema import OpenAIFunctionToolSchema

MAX_EXPRESSION_CHARS = 500
MAX_DIGITS = 1000

_BINARY = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
           ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod}
_SYMBOLS = {"×": "*", "÷": "/", "^": "**", "x": "*", "X": "*"}


class CalculationError(ToolError, ValueError):
    """An expression the calculator cannot evaluate; the message is shown to the model."""


def _digits(value: Fraction) -> int:
    return max(len(str(abs(value.numerator))), len(str(value.denominator)))


def _power(base: Fraction, exponent: Fraction) -> Fraction:
    if exponent.denominator != 1:
        raise CalculationError("only whole-number exponents are supported")
    e = int(exponent)
    if base == 0 and e < 0:
        raise CalculationError("division by zero (0 to a negative power)")
    size = abs(e) * math.log10(max(abs(base.numerator), base.denominator))  # 0 for 0, 1 and -1: one digit
    if size > MAX_DIGITS:
        raise CalculationError(f"the result would have about {int(size)} digits (the limit is {MAX_DIGITS})")
    return base ** e


def _walk(node: ast.AST) -> Fraction:
    if isinstance(node, ast.Expression):
        return _walk(node.body)
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        if isinstance(node.value, float) and not math.isfinite(node.value):  # 1e999 reads as inf
            raise CalculationError(f"a number too large to read (it overflows to {node.value})")
        return Fraction(repr(node.value)) if isinstance(node.value, float) else Fraction(node.value)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.UAdd, ast.USub)):
        value = _walk(node.operand)
        return -value if isinstance(node.op, ast.USub) else value
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Pow):
        return _power(_walk(node.left), _walk(node.right))
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _walk(node.left), _walk(node.right)
        if right == 0 and isinstance(node.op, (ast.Div, ast.FloorDiv, ast.Mod)):
            raise CalculationError("division by zero")
        value = Fraction(_BINARY[type(node.op)](left, right))
        if _digits(value) > MAX_DIGITS:
            raise CalculationError(f"the result has more than {MAX_DIGITS} digits")
        return value
    if isinstance(node, ast.Name):
        raise CalculationError(f"unknown name {node.id!r}: only numbers and + - * / // % ** ( ) are allowed")
    raise CalculationError(f"unsupported element {type(node).__name__}: only numbers and + - * / // % ** ( ) are allowed")


def format_number(value: Fraction) -> str:
    """An integer as is; a fraction as a terminating decimal, else ``p/q``."""
    if value.denominator == 1:
        return str(value.numerator)
    d = value.denominator
    for p in (2, 5):
        while d % p == 0:
            d //= p
    if d != 1:
        return f"{value.numerator}/{value.denominator}"
    places = 0
    while (value * 10 ** places).denominator != 1:
        places += 1
    scaled = abs(value.numerator) * 10 ** places // value.denominator
    sign = "-" if value < 0 else ""
    return f"{sign}{scaled // 10 ** places}.{scaled % 10 ** places:0{places}d}"


def calculate(expression: str) -> str:
    """Evaluate ``expression`` exactly -> its value as text; raises CalculationError with a reason."""
    if not isinstance(expression, str) or not expression.strip():
        raise CalculationError("empty expression")
    if len(expression) > MAX_EXPRESSION_CHARS:
        raise CalculationError(f"expression longer than {MAX_EXPRESSION_CHARS} characters")
    text = expression.strip().rstrip("=").replace(",", "")
    for symbol, op in _SYMBOLS.items():
        text = text.replace(symbol, op)
    try:
        tree = ast.parse(text, mode="eval")
    except SyntaxError:
        raise CalculationError(f"cannot parse {expression!r} as arithmetic") from None
    return format_number(_walk(tree))


class CalculatorTool(BaseTool):
    """``calculator(expression)``: the exact value of an arithmetic expression."""

    @classmethod
    def default_schema(cls) -> OpenAIFunctionToolSchema:
        return OpenAIFunctionToolSchema.from_dict({"type": "function", "function": {
            "name": "calculator",
            "description": "Evaluate an arithmetic expression exactly (+ - * / // % ** and parentheses).",
            "parameters": {"type": "object", "properties": {
                "expression": {"type": "string", "description": "the expression, e.g. 123 * 45 + 6"}},
                "required": ["expression"]}}})

    async def execute(self, instance_id: str, parameters: dict[str, Any], **execute_kwargs) -> tuple[str, float, dict]:
        return await asyncio.to_thread(calculate, parameters.get("expression", "")), 0.0, {}
