"""``rlvr train`` as a benchmark runs it: in a child process, its log kept, its records read back."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


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
