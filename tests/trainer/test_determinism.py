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

A run also fixes its thread count and turns dynamic threading off (``MKL_DYNAMIC``,
``OMP_DYNAMIC``: Intel's conditions for reproducible results; ``rlvr/determinism.py``), and the
generate-ahead thread computes with the trainer's thread count. The two-process runs below
run side by side, so each loads the cores the other computes on (a busy machine), and run
enough steps for a last-bit difference to become other samples (it did at step 3 before).
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from rlvr.data.prepare import prepare_arithmetic

VOLATILE = ("timing_s/", "timing_per_token_ms/", "perf/time_per_step", "perf/throughput", "time",
            "perf/cpu_max_rss_gb", "perf/max_memory_allocated_gb", "perf/trainer_idle_ratio", "perf/rollout_idle_ratio")


ENV_KEYS = ("MKL_CBWR", "MKL_DYNAMIC", "OMP_DYNAMIC")


def caller_env() -> dict:
    """The caller's environment without the settings rlvr makes: rlvr sets them, not the caller."""
    return {k: v for k, v in os.environ.items() if k not in ENV_KEYS}


def run(tmp_path: Path, name: str, paths: dict, engine: str) -> tuple[list[dict], list[str]]:
    run_dir = tmp_path / name
    env = caller_env()
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


SETTINGS = """
import os, sys
import rlvr  # before torch: MKL and OpenMP read these when they start
import torch
print(*[os.environ.get(k) for k in sys.argv[1:]], torch.get_num_threads())
"""


def test_import_sets_reproducible_threading_and_keeps_a_users_value():
    """MKL's strict mode, and neither MKL nor OpenMP may change a call's thread count at run time
    (Intel's reproducibility conditions). A user's own value is kept."""
    env = caller_env()
    out = subprocess.run([sys.executable, "-c", SETTINGS, *ENV_KEYS], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.split()[:3] == ["AUTO,STRICT", "FALSE", "FALSE"]
    out = subprocess.run([sys.executable, "-c", SETTINGS, *ENV_KEYS], env={**env, "MKL_DYNAMIC": "TRUE"},
                         capture_output=True, text=True, check=True)
    assert out.stdout.split()[:3] == ["AUTO,STRICT", "TRUE", "FALSE"]


def test_generate_ahead_thread_computes_with_the_trainers_thread_count():
    """torch's intra-op count is per thread: a fresh thread starts at the machine's default, so the
    engine's thread is given the trainer's (1 here, where the default on a multi-core machine is more)."""
    import torch

    from rlvr.trainer.rollout_ahead import CopyWeights, RolloutAhead

    before = torch.get_num_threads()
    torch.set_num_threads(1)  # a no-op once vLLM's CPU worker has bound the threads in this process
    try:
        ahead = RolloutAhead(rollout_wg=None, ahead=1, weights=CopyWeights(None, None))
        assert ahead._thread.submit(torch.get_num_threads).result() == torch.get_num_threads()
        ahead.close()
    finally:
        torch.set_num_threads(before)


def concurrent_runs(tmp_path: Path, names: list[str], overrides: list[str]) -> dict[str, list[dict]]:
    """Processes of the CLI started together, so that they load the cores each other computes on."""
    rlvr = Path(sys.executable).parent / "rlvr"
    procs = {name: subprocess.Popen([str(rlvr), "train", *overrides, f"trainer.default_local_dir={tmp_path / name}"],
                                    env=caller_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
             for name in names}
    for name, proc in procs.items():
        _, err = proc.communicate(timeout=900)
        assert proc.returncode == 0, (name, err[-2000:])
    return {name: [{k: v for k, v in json.loads(line).items() if not k.startswith(VOLATILE)}
                   for line in open(tmp_path / name / "metrics.jsonl")] for name in names}


TINY_STEPS = 6


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["sync", "one_step_off"])
def test_two_runs_side_by_side_agree_bitwise_past_step_three(tmp_path, tiny_model_dir, mode):
    """Two runs of a tiny model at once, 6 steps: a last-bit difference at step 1 became other samples
    by step 3 on the default job, so 2 steps could not catch it."""
    paths = prepare_arithmetic(tmp_path / "data", train_size=64, test_size=4)
    overrides = [f"actor_rollout_ref.model.path={tiny_model_dir}", f"data.train_files=[{paths['train']}]",
                 f"data.val_files=[{paths['test']}]", "data.train_batch_size=4", "data.max_response_length=16",
                 "actor_rollout_ref.rollout.n=4", "actor_rollout_ref.actor.ppo_mini_batch_size=4",
                 "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8", "actor_rollout_ref.actor.optim.lr=1e-3",
                 f"trainer.total_training_steps={TINY_STEPS}", "trainer.val_before_train=false", "trainer.test_freq=-1",
                 "trainer.save_freq=-1", "trainer.logger=[jsonl]"]
    if mode == "one_step_off":
        overrides += ["trainer.v1.trainer_mode=colocate_async", "trainer.v1.colocate_async.num_warmup_batches=1"]
    runs = concurrent_runs(tmp_path, ["first", "second"], overrides)
    first, second = runs["first"], runs["second"]
    assert [r["step"] for r in first] == list(range(1, TINY_STEPS + 1))
    for step, (a, b) in enumerate(zip(first, second), start=1):
        assert a == b, (step, {k: (a[k], b.get(k)) for k in a if a[k] != b.get(k)})
    assert len({r["actor/grad_norm"] for r in first}) == TINY_STEPS  # the steps trained: no repeated norm


def grouped_gradient(model, batch, uids) -> dict:
    """The parameters' gradient of one micro-batch's log-probs in the prompt-once layout (the actor's forward)."""
    import torch

    from rlvr.workers.forward import forward_log_probs

    model.zero_grad(set_to_none=True)
    weights = torch.linspace(-1, 1, batch["responses"].numel()).reshape(batch["responses"].shape)
    (forward_log_probs(model, batch, uids, 1.0)[0] * weights).sum().backward()
    return {name: p.grad.clone() for name, p in model.named_parameters()}


def test_grouped_forward_gradient_does_not_depend_on_thread_timing(tiny_model_dir):
    """Every response of a group reads the prompt's last hidden state (it predicts each response's
    first token), so the backward adds 8 gradients into that state. Picked by advanced indexing,
    torch's CPU backward (index_put_ with accumulate) added them with parallel atomic adds, in
    an order set by how the two threads were scheduled: on a loaded machine two runs' step-1
    grad_norm differed in the last bit (0.7829741835594177 / 0.7829742431640625), and by step 3
    the samples. Repeats with 2 threads and 1 thread must agree bitwise."""
    import numpy as np
    import torch

    from rlvr.models import load_model

    model = load_model(tiny_model_dir)
    g, n, P, R = 3, 8, 30, 48  # 3 x 8 x 48 = 1,152 picked states, 64 wide: over torch's 32,768-element grain, so
    # 2 threads split them, and the split (at state 576) falls inside group 2: both threads add into its prompt state
    gen = torch.Generator().manual_seed(0)
    prompts = torch.randint(10, 1000, (g, P), generator=gen).repeat_interleave(n, 0)
    responses = torch.randint(10, 1000, (g * n, R), generator=gen)
    ids = torch.cat([prompts, responses], 1)
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "responses": responses,
             "position_ids": torch.arange(P + R).expand(g * n, -1)}
    uids = np.array([f"group-{i // n}" for i in range(g * n)], dtype=object)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        first = grouped_gradient(model, batch, uids)
        runs = [grouped_gradient(model, batch, uids) for _ in range(12)]
        torch.set_num_threads(1)
        runs.append(grouped_gradient(model, batch, uids))
    finally:
        torch.set_num_threads(before)
    differing = [i for i, run in enumerate(runs) if any(not torch.equal(first[k], run[k]) for k in first)]
    assert differing == [], f"{len(differing)} of {len(runs)} repeats gave other gradient bits"
