"""What the bench scripts share: ``rlvr train`` as a benchmark runs it (in a child process, its log
kept, its records read back), a child's failure told with its output, and argparse types that
refuse a bad argument before any work starts (argparse's usage error, exit status 2)."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def at_least(minimum: int | float, kind: type = int):
    """An argparse type: a number (``kind``) no smaller than ``minimum``. A count below what the script
    needs (0 repeats, 1 step where the first is left out) would end in an empty median after the work."""
    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not {'an integer' if kind is int else 'a number'}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"{value} is below the minimum, {minimum}")
        return value
    return parse


def one_of(*choices: str):
    """An argparse type: one of ``choices``; an error lists them. (For one name ``choices=`` does the
    same; this one also checks each item of a ``comma_list``.)"""
    def parse(text: str) -> str:
        if text not in choices:
            raise argparse.ArgumentTypeError(f"{text!r} is not one of {', '.join(choices)}")
        return text
    return parse


def comma_list(item):
    """An argparse type: comma-separated values, each read by the type ``item`` (at least one)."""
    def parse(text: str) -> list:
        values = [item(part) for part in text.split(",") if part]
        if not values:
            raise argparse.ArgumentTypeError("no value given")
        return values
    return parse


def override_key(override: str) -> str:
    """The key a ``key=value`` override sets (Hydra's ``+key``, ``++key`` and ``~key`` forms too)."""
    return override.split("=", 1)[0].strip().lstrip("+~")


def run_child(command: list[str], what: str, **kwargs) -> str:
    """``command``'s stdout; when it fails, the benchmark stops with the end of its output (not a
    bare CalledProcessError, which hides what the child said)."""
    done = subprocess.run(command, capture_output=True, text=True, **kwargs)
    if done.returncode:
        raise SystemExit(f"{what} failed (exit status {done.returncode}):\n{done.stdout[-2000:]}\n{done.stderr[-5000:]}")
    return done.stdout


def fresh_run_dir(run_dir: Path) -> Path:
    """``run_dir``, refused when it holds an earlier run: rlvr would write the new run to
    ``run_dir-2`` (trainer.resume_mode=disable) and the bench would read the old one's records."""
    if run_dir.is_dir() and any(run_dir.iterdir()):
        raise SystemExit(f"{run_dir} holds an earlier run: remove it or give the bench another --out")
    return run_dir


def rlvr_train(overrides: list[str], run_dir: Path, log: Path) -> dict:
    """One ``rlvr train`` into ``run_dir`` (no resume, jsonl metrics): its wall time, metric records
    and greedy validation accuracy by step (the run's ``val-core/.../mean@1``). A failed run stops
    the benchmark with the end of its output."""
    fresh_run_dir(run_dir)
    command = [sys.executable, "-m", "rlvr.cli", "train", *overrides, f"trainer.default_local_dir={run_dir}",
               "trainer.resume_mode=disable", "trainer.logger=[jsonl]"]
    start = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, cwd=ROOT)
    wall = time.perf_counter() - start
    log.write_text(done.stdout + "\n" + done.stderr)
    if done.returncode:
        raise SystemExit(f"rlvr train ({run_dir.name}) failed:\n{done.stdout[-3000:]}\n{done.stderr[-5000:]}")
    records = [json.loads(line) for line in open(run_dir / "metrics.jsonl")]
    val_key = next(k for r in records for k in r if k.startswith("val-core/") and k.endswith("mean@1"))
    return {"wall_s": wall, "records": records, "accuracy": {r["step"]: r[val_key] for r in records if val_key in r}}
