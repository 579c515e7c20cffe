"""Where step metrics go: a compact console line, and ``metrics.jsonl`` in the run directory.

``trainer.logger`` lists the backends (``console``, ``jsonl``; ``tensorboard`` and
``wandb`` are accepted names whose writers land with run management). Console lines are
written through tqdm so the progress bar stays at the bottom.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

from tqdm import tqdm

KNOWN_BACKENDS = ("console", "jsonl", "tensorboard", "wandb")

# (metric, label, format) shown on the console line, in order, when present
CONSOLE_FIELDS = (
    ("critic/score/mean", "reward", "{:.3f}"),
    ("actor/pg_loss", "pg_loss", "{:+.4f}"),
    ("actor/kl_loss", "kl", "{:.5f}"),
    ("actor/entropy", "entropy", "{:.3f}"),
    ("actor/grad_norm", "grad", "{:.3f}"),
    ("response_length/mean", "len", "{:.1f}"),
    ("timing_s/step", "step_s", "{:.1f}"),
)


class Tracking:
    def __init__(self, backends: list[str], run_dir: str | Path | None, progress_bar: bool = True):
        unknown = [b for b in backends if b not in KNOWN_BACKENDS]
        if unknown:
            raise ValueError(f"trainer.logger has unknown backends {unknown}; choose from {list(KNOWN_BACKENDS)}")
        self.backends = list(backends)
        self.run_dir = None if run_dir is None else Path(run_dir)
        self.progress_bar = progress_bar
        self._jsonl = None
        if "jsonl" in self.backends and self.run_dir is not None:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            self._jsonl = open(self.run_dir / "metrics.jsonl", "a")

    def log(self, metrics: dict[str, float], step: int) -> None:
        if self._jsonl is not None:
            record = {"step": step, "time": time.time(), **{k: _plain(v) for k, v in metrics.items()}}
            self._jsonl.write(json.dumps(record) + "\n")
            self._jsonl.flush()
        if "console" in self.backends:
            tqdm.write(console_line(metrics, step))

    def close(self) -> None:
        if self._jsonl is not None:
            self._jsonl.close()
            self._jsonl = None


def _plain(value):
    value = float(value)
    return value if math.isfinite(value) else str(value)


def console_line(metrics: dict[str, float], step: int) -> str:
    """``step 3 | reward 0.412 | ... | val acc 0.53`` from the metrics present."""
    parts = [f"step {step}"]
    for key, label, fmt in CONSOLE_FIELDS:
        if key in metrics:
            parts.append(f"{label} {fmt.format(metrics[key])}")
    for key, value in sorted(metrics.items()):
        if key.startswith("val-core/"):
            parts.append(f"{key.removeprefix('val-core/')} {value:.3f}")
    return " | ".join(parts)
