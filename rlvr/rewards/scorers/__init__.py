"""Built-in scorers. Each has the signature
``score(data_source, solution_str, ground_truth, extra_info=None) -> float | dict``, and those
that compare against the ground truth have a check of it that the dataset runs at load
(``rlvr.rewards.registry.TruthCheck``)."""

from __future__ import annotations

from math import isfinite  # not `import math`: the name is the math scorer's module

import numpy as np


def one_answer(ground_truth) -> bool:
    """One answer a response can equal: text, an integer or a finite number. The scorers that
    compare text never raise, but ``str(["72"])`` equals no answer, nor does NaN."""
    if isinstance(ground_truth, (float, np.floating)):
        return isfinite(ground_truth)
    return isinstance(ground_truth, (str, int, np.integer))
