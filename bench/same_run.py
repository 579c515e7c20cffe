"""Same seed, same run: the whole default job twice, compared bit for bit.

    python bench/same_run.py --modes sync,async0,async1 --steps 24 --out /tmp/same_run

For each mode it runs `rlvr train` (this checkout's) once alone (quiet) and once
beside processes that keep every core busy (loaded), then compares the two runs'
metrics.jsonl (every key but timings and memory) and rollouts/*.jsonl (the
sampled text, scores and advantages) byte for byte. The first difference is
printed with its step and key. Exit status 1 if any pair differs. A run folder
that already holds all its steps is kept, not run again; one that holds anything
else (an interrupted run, a run of another --steps) is refused before any run
starts: `rlvr train` would write the new run to `<folder>-2` and this script
would compare the old one.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import subprocess
import sys
import time
from pathlib import Path

from runs import at_least, comma_list, fresh_run_dir, one_of

MODES = {
    "sync": [],
    "async0": ["trainer.v1.trainer_mode=colocate_async",
               "trainer.v1.colocate_async.num_warmup_batches=0"],
    "async1": ["trainer.v1.trainer_mode=colocate_async",
               "trainer.v1.colocate_async.num_warmup_batches=1"],
}
# Keys that measure the machine, not the run.
MACHINE_KEYS = ("time", "perf/time_per_step", "perf/throughput", "perf/cpu_max_rss_gb",
                "perf/rollout_idle_ratio", "perf/trainer_idle_ratio")  # async: shares of wall time
MACHINE_PREFIXES = ("timing_s/", "timing_per_token_ms/")


def _spin(stop_at: float) -> None:
    x = 1.0001
    while time.time() < stop_at:
        for _ in range(100_000):
            x = x * 1.0000001 % 7.0


def kept(folder: Path, steps: int) -> bool:
    """True when ``folder`` holds a complete run of ``steps`` steps (kept, not run again); False when
    it is missing or empty (to run). Anything else in it is refused, naming the folder."""
    try:
        if len(_run_record(folder)) == steps:
            return True
    except (OSError, ValueError):  # no metrics.jsonl, or its last line cut short
        pass
    fresh_run_dir(folder)
    return False


def run_job(mode: str, steps: int, folder: Path, load: bool) -> float:
    cmd = [sys.executable, "-m", "rlvr.cli", "train",
           f"trainer.total_training_steps={steps}", "trainer.test_freq=-1",
           "trainer.val_before_train=false", "trainer.save_freq=-1",
           f"trainer.experiment_name={folder.name}", f"trainer.default_local_dir={folder}",
           *MODES[mode]]
    spinners = []
    if load:  # one busy process per core, for the whole run
        for _ in range(os.cpu_count() or 1):
            p = mp.Process(target=_spin, args=(time.time() + 4 * 3600,), daemon=True)
            p.start()
            spinners.append(p)
    start = time.time()
    try:
        with open(folder.with_suffix(".log"), "w") as log:
            # this checkout's rlvr, whatever is installed
            env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
            subprocess.run(cmd, check=True, stdout=log, stderr=subprocess.STDOUT, env=env)
    finally:
        for p in spinners:
            p.terminate()
    return time.time() - start


def _run_record(folder: Path) -> list[dict]:
    rows = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items()
             if k not in MACHINE_KEYS and not k.startswith(MACHINE_PREFIXES)} for r in rows]


def first_difference(a: Path, b: Path) -> str | None:
    ra, rb = _run_record(a), _run_record(b)
    if len(ra) != len(rb):
        return f"metrics.jsonl has {len(ra)} rows against {len(rb)}"
    for x, y in zip(ra, rb):
        for key in sorted(set(x) | set(y)):
            if x.get(key) != y.get(key) and not (x.get(key) != x.get(key) and y.get(key) != y.get(key)):
                return f"step {x.get('step')}: {key} {x.get(key)!r} against {y.get(key)!r}"
    files_a = sorted(p.name for p in (a / "rollouts").glob("*.jsonl"))
    files_b = sorted(p.name for p in (b / "rollouts").glob("*.jsonl"))
    if files_a != files_b:
        return f"rollouts/ holds {files_a} against {files_b}"
    for name in files_a:
        if (a / "rollouts" / name).read_bytes() != (b / "rollouts" / name).read_bytes():
            return f"rollouts/{name} differs"
    return None


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--modes", type=comma_list(one_of(*MODES)), default="sync,async0,async1")
    ap.add_argument("--steps", type=at_least(1), default=24)
    ap.add_argument("--out", default="/tmp/same_run")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    out = Path(args.out)
    folders = {mode: (out / f"{mode}_quiet", out / f"{mode}_loaded") for mode in args.modes}
    keep = {folder: kept(folder, args.steps) for pair in folders.values() for folder in pair}  # before any run
    for folder in (folder for folder, complete in keep.items() if complete):
        print(f"{folder.name}: kept (its {args.steps} steps are there)", flush=True)
    out.mkdir(parents=True, exist_ok=True)
    failed = False
    for mode, (quiet, loaded) in folders.items():
        t_quiet = float("nan") if keep[quiet] else run_job(mode, args.steps, quiet, load=False)
        t_loaded = float("nan") if keep[loaded] else run_job(mode, args.steps, loaded, load=True)
        diff = first_difference(quiet, loaded)
        rows = len(_run_record(quiet))
        verdict = "bitwise equal" if diff is None else f"DIFFER: {diff}"
        print(f"{mode}: {rows} steps, quiet {t_quiet / 60:.1f} min, loaded {t_loaded / 60:.1f} min: "
              f"{verdict}", flush=True)
        failed |= diff is not None
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
