"""Math answers checked by the ``math-verify`` library: boxed answers, LaTeX, fractions,
intervals and sets, compared symbolically. Timeouts are left to the reward manager (its
per-sample limit), so math-verify's own signal timers are switched off."""

from __future__ import annotations

import functools
import logging
import re

from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify

from rlvr.rewards.scorers import one_answer

# math-verify warns once per process that its timers are off; the manager's per-sample timer is on
logging.getLogger("math_verify").setLevel(logging.ERROR)

_GOLD_CONFIG = [LatexExtractionConfig(), ExprExtractionConfig()]
_MATH_DELIMITER = re.compile(r"(?<!\\)\$")  # a "$" that opens or closes math; "\$" is a dollar sign


def _gold(ground_truth: str):
    return _parse_gold(str(ground_truth))


@functools.lru_cache(maxsize=16384)
def _parse_gold(text: str):
    """The parsed gold answer, once per text and process: the load's check parses each row's, and
    every step scores n samples against the same one (a tuple: the cached value is shared)."""
    if "\\boxed" not in text and not _MATH_DELIMITER.search(text):
        text = f"${text}$"  # a bare gold answer like "\\frac{1}{2}" or "3" is LaTeX without delimiters
    return tuple(parse(text, _GOLD_CONFIG, parsing_timeout=None))


def truth_fits(ground_truth) -> bool:
    """``compute_score`` can score against ``ground_truth``: one answer that math-verify parses."""
    return one_answer(ground_truth) and bool(_gold(ground_truth))


def compute_score(data_source, solution_str, ground_truth, extra_info=None) -> dict:
    gold = _gold(ground_truth)
    if not gold:
        raise ValueError(f"math-verify cannot parse the ground truth {ground_truth!r}")
    answer = parse(solution_str, parsing_timeout=None)
    correct = bool(answer) and verify(list(gold), answer, timeout_seconds=None)  # verify takes a list, not a tuple
    return {"score": 1.0 if correct else 0.0, "acc": float(correct), "has_answer": float(bool(answer))}
