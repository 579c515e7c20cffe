"""verl's DAPO math scorer: +1.0 for the right answer, -1.0 otherwise (DAPO trains on ±1).

The answer is the text after the last ``Answer:`` (any case) in the response's last 300
characters: a model that ends on "Answer: 12" is read; an "Answer:" earlier than that is not,
as in verl. Answer and ground truth are compared as strings after Minerva's normalisation
(Lewkowycz et al., 2022): the right side of a final "=", spaces, units and filler words and
``\\text{}``-style wrappers, ``\\boxed{}`` and ``$`` removed, ``\\fracab`` read as
``\\frac{a}{b}``, thousands commas of a whole number dropped. No symbolic comparison:
``0.5`` is not ``\\frac{1}{2}`` (the ``math`` scorer, math-verify, compares values).
"""

from __future__ import annotations

import re

WINDOW = 300
"""Characters at the end of the response that are searched for the answer (verl's)."""
_ANSWER = re.compile(r"(?i)Answer\s*:\s*([^\n]+)")
NO_ANSWER = "[INVALID]"
"""The ``pred`` of a response without an ``Answer:`` line (verl's)."""

# Minerva's normalisation, applied in this order: these plain replacements, then these removals
_REPLACED = (("an ", ""), ("a ", ""), (".$", "$"), ("\\$", ""), ("\\ ", ""), (" ", ""), ("mbox", "text"),
             (",\\text{and}", ","), ("\\text{and}", ","), ("\\text{m}", "\\text{}"))
_REMOVED = ("square", "ways", "integers", "dollars", "mph", "inches", "hours", "km", "units", "\\ldots", "sue",
            "points", "feet", "minutes", "digits", "cents", "degrees", "cm", "gm", "pounds", "meters", "meals",
            "edges", "students", "childrentickets", "multiples", "\\text{s}", "\\text{.}", "\\text{\ns}",
            "\\text{}^2", "\\text{}^3", "\\text{\n}", "\\text{}", "\\mathrm{th}", "^\\circ", "^{\\circ}", "\\;",
            ",\\!", "{,}", '"', "\\dots")
_UNWRAPPED = [re.compile(rf"\\{command}\{{(.*?)\}}") for command in ("text", "textbf", "overline")] + \
    [re.compile(r"\\boxed\{(.*)\}")]  # in turn: \text{\textbf{x}} -> x


def normalize_answer(text: str) -> str:
    """Minerva's normal form of a final answer: ``"x = \\boxed{12} dollars"`` -> ``"12"``."""
    text = text.split("=")[-1]
    for old, new in _REPLACED:
        text = text.replace(old, new)
    for word in _REMOVED:
        text = text.replace(word, "")
    text = re.sub(r"^.*?\$(.*?)\$.*$", r"$\1$", text)  # the first $...$ span stands for the answer
    for wrapper in _UNWRAPPED:
        text = wrapper.sub(r"\1", text)
    text = re.sub(r"frac([^{])(.)", r"frac{\1}{\2}", text)  # \frac12 -> \frac{1}{2}
    text = re.sub(r"sqrt([^{])", r"sqrt{\1}", text)  # \sqrt2 -> \sqrt{2}
    text = text.replace("$", "")
    if text.replace(",", "").isdigit():
        text = text.replace(",", "")
    return text.strip()


def compute_score(data_source, solution_str, ground_truth, extra_info=None) -> dict:
    found = _ANSWER.findall(solution_str[-WINDOW:])
    pred = normalize_answer(found[-1]) if found else NO_ANSWER
    correct = pred == normalize_answer(str(ground_truth))
    return {"score": 1.0 if correct else -1.0, "acc": float(correct), "pred": pred}
