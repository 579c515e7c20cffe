"""Two fresh processes of one run agree bitwise, step after step, on the native engine and vLLM.

The source of the disagreement seen before: MKL splits a long reduction over its threads, and
the split decides the rounding. The vocabulary projection's backward (the hidden states'
gradient, dlogits @ W: a sum over 49,152 vocabulary entries) gave other bits on 1 thread than
on 2 (up to 4e-3 apart on one row, 3.7e-4 on 64 rows; `test_mkl_reduction_does_not_depend_on_
its_thread_count` below), and MKL decides how many threads a call uses at run time (its dynamic
threading may take fewer than torch asks for). Seen on this machine before rlvr set ``MKL_CBWR``:
two runs of the default job sampled the same step-1 tokens with the same losses and differed in
grad_norm (0.772248447 vs 0.772248387), then in the tokens of step 2. ``MKL_CBWR=AUTO,STRICT``
(MKL's strict reproducible mode: the same bits whatever the number of threads) removes it; rlvr
sets it on import (``rlvr/__init__.py``; a forward and backward of the built-in model took
9.8-10.7 s either way).
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


PROBE = """
import os, sys, torch
if sys.argv[1] == "rlvr":
    import rlvr  # sets MKL_CBWR unless the caller did
torch.manual_seed(0)
dlogits, vocab = torch.randn(1, 49152), torch.randn(49152, 576)  # one row of the projection's backward
torch.set_num_threads(2)
two = dlogits @ vocab
torch.set_num_threads(1)
one = dlogits @ vocab
print(os.environ.get("MKL_CBWR"), torch.equal(one, two))
"""


def test_mkl_reduction_does_not_depend_on_its_thread_count():
    """Fails when rlvr no longer sets MKL_CBWR on import. The control (no rlvr, no MKL_CBWR) shows
    that this CPU's MKL does split the reduction; where it does not, there is nothing to guard."""
    env = {k: v for k, v in os.environ.items() if k != "MKL_CBWR"}
    control = subprocess.run([sys.executable, "-c", PROBE, "plain"], env=env, capture_output=True, text=True, check=True)
    if control.stdout.split() != ["None", "False"]:
        pytest.skip(f"MKL on this CPU gives one result for 1 and 2 threads without MKL_CBWR ({control.stdout.strip()})")
    guarded = subprocess.run([sys.executable, "-c", PROBE, "rlvr"], env=env, capture_output=True, text=True, check=True)
    assert guarded.stdout.split() == ["AUTO,STRICT", "True"]


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
