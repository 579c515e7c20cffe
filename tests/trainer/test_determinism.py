"""Two fresh processes of one run agree bitwise, step after step, on the native engine and vLLM.

Seen on this machine, runs of the default job on the built-in model without ``MKL_CBWR``: two
runs sampled the same step-1 tokens with the same losses and differed in grad_norm
(0.772248447 vs 0.772248387), then in the tokens of step 2; the same pair with
``MKL_CBWR=AUTO,STRICT`` (MKL's reproducible mode) agreed on every metric of 3 steps, as two
earlier runs did. rlvr sets it on import (``rlvr/__init__.py``; no cost measured: a forward
and backward of the built-in model took 9.8-10.7 s either way). The difference has not been
reproduced on demand: this test, run three times without the setting (quiet, and beside a
busy process), passed (the busy process was dropped from it), so it guards the property and not, reliably, that mechanism.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from rlvr.data.prepare import prepare_arithmetic

VOLATILE = ("timing_s/", "timing_per_token_ms/", "perf/time_per_step", "perf/throughput", "time",
            "perf/cpu_max_rss_gb", "perf/max_memory_allocated_gb")


def run(tmp_path: Path, name: str, paths: dict, engine: str) -> tuple[list[dict], list[str]]:
    run_dir = tmp_path / name
    env = {k: v for k, v in os.environ.items() if k != "MKL_CBWR"}  # rlvr sets it, not the caller
    rlvr = Path(sys.executable).parent / "rlvr"
    subprocess.run([str(rlvr), "train", f"data.train_files=[{paths['train']}]", f"data.val_files=[{paths['test']}]",
                    "trainer.val_before_train=false", "trainer.test_freq=-1",
                    f"actor_rollout_ref.rollout.name={engine}", "trainer.total_training_steps=2",
                    "trainer.logger=[jsonl]", f"trainer.default_local_dir={run_dir}"],
                   env=env, check=True, timeout=900, stdout=subprocess.DEVNULL)
    records = [{k: v for k, v in json.loads(line).items() if not k.startswith(VOLATILE)}
               for line in open(run_dir / "metrics.jsonl")]
    rollouts = [(run_dir / "rollouts" / f"{step}.jsonl").read_text() for step in (1, 2)]
    return records, rollouts


@pytest.mark.slow
@pytest.mark.parametrize("engine", ["native", "vllm"])
def test_two_fresh_processes_of_one_run_agree_bitwise(tmp_path, builtin_dir, engine):
    paths = prepare_arithmetic(tmp_path / "data", train_size=256, test_size=8)
    first_records, first_rollouts = run(tmp_path, "first", paths, engine)
    second_records, second_rollouts = run(tmp_path, "second", paths, engine)
    assert [r["step"] for r in first_records] == [1, 2]
    for step, (a, b) in enumerate(zip(first_records, second_records), start=1):
        assert a == b, (step, {k: (a[k], b.get(k)) for k in a if a[k] != b.get(k)})
    # the sampled responses (text, scores, advantages) of every step, byte for byte
    assert first_rollouts == second_rollouts
    # and the runs did learn something: the steps' losses are not one repeated value
    assert len({r["actor/grad_norm"] for r in first_records}) == 2
