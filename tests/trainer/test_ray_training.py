"""`rlvr train` on a local Ray cluster of 2 CPU workers (FSDP2, gloo on 127.0.0.1) equals the
in-process run with the same global batch: the same metrics, step by step, and the same final
weights. A worker killed mid-run stops the run with an error naming its rank and the last
checkpoint; the same command then resumes and finishes. Ctrl-C saves the current step.

The Ray runs are `rlvr train` processes inside a network namespace whose only interface is
the loopback (``tests/loopback_only.py``): Ray's gRPC servers listen on every interface.
The tiny model's rows stop early (a stop string) and the built-in model's at EOS, so the ranks
answer responses of different widths, as a real run's do."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from safetensors.torch import load_file

from rlvr.config import to_yaml
from rlvr.trainer.main import run_training

sys.path.insert(0, str(Path(__file__).parents[1]))
from loopback_only import loopback_only  # noqa: E402

pytestmark = [pytest.mark.ray, pytest.mark.slow]  # each test starts Ray and trains end to end: 15-100 s
import ray  # noqa: E402,F401  make test installs Ray: a missing install fails, not skips

VOLATILE = ("timing_s/", "timing_per_token_ms/", "perf/time_per_step", "perf/throughput", "time",
            "training/rollout_probs_diff", "perf/cpu_max_rss_gb", "perf/max_memory_allocated_gb",
            "perf/trainer_idle_ratio", "perf/rollout_idle_ratio", "multi_turn/tool_latency",
            "val-aux/multi_turn/tool_latency")
RAY_2_CPU = ["trainer.device=cpu", "trainer.n_gpus_per_node=2", "actor_rollout_ref.actor.strategy=fsdp2"]
STEPS = ["trainer.total_training_steps=3", "trainer.save_freq=3", "data.train_batch_size=4",
         "actor_rollout_ref.actor.ppo_mini_batch_size=2", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=3",
         "actor_rollout_ref.actor.use_kl_loss=true", "trainer.test_freq=3", "trainer.val_before_train=true",
         "data.val_batch_size=3",  # 4 validation prompts: batches of 3 and 1, padded to whole ranks and trimmed
         # the tiny model never samples EOS: a stop string ends rows after 1-7 tokens, so the ranks'
         # responses differ in width, as a real model's do (main crashed joining them)
         "actor_rollout_ref.rollout.stop=[r]"]


def records(run_dir):
    return [json.loads(line) for line in open(Path(run_dir) / "metrics.jsonl")]


def final_weights(run_dir, step):
    return load_file(Path(run_dir) / "checkpoints" / f"global_step_{step}" / "actor" / "model.safetensors")


def assert_same_metrics(got, expected):
    assert [r["step"] for r in got] == [r["step"] for r in expected]
    for g, e in zip(got, expected):
        keys = {k for k in e if not k.startswith(VOLATILE)}
        assert keys == {k for k in g if not k.startswith(VOLATILE)}
        for key in keys:
            assert g[key] == pytest.approx(e[key], rel=1e-4, abs=2e-5), (g["step"], key)


def assert_same_weights(got, expected):
    for key in expected:  # Adam may turn a ~1e-9 gradient's rounding into a visible step on a few entries
        diff = (got[key] - expected[key]).abs()
        assert int((diff > 2e-5).sum()) <= 8 and float(diff.max()) < 1e-3, key


@pytest.fixture
def in_process_run(tiny_config, tmp_path):
    run_dir = tmp_path / "local"
    run_training(tiny_config(*STEPS, f"trainer.default_local_dir={run_dir}"))
    return run_dir


def train_command(config, tmp_path, name="config.yaml"):
    config_file = tmp_path / name
    config_file.write_text(to_yaml(config))
    return loopback_only([sys.executable, "-m", "rlvr.cli", "train", "--config", str(config_file)])


def test_two_ray_workers_equal_the_in_process_run(tiny_config, tmp_path, in_process_run):
    ray_dir = tmp_path / "ray"
    done = subprocess.run(train_command(tiny_config(*STEPS, *RAY_2_CPU, f"trainer.default_local_dir={ray_dir}"),
                                        tmp_path), capture_output=True, text=True, timeout=400)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    got, expected = records(ray_dir), records(in_process_run)
    assert_same_metrics(got, expected)
    assert any(r.get("actor/grad_norm", 0) > 0 for r in got)  # it trained
    assert_same_weights(final_weights(ray_dir, 3), final_weights(in_process_run, 3))
    where = json.loads((ray_dir / "workers.json").read_text())
    assert [w["rank"] for w in where] == [0, 1] and all(w["node"] == "127.0.0.1" for w in where)
    # Ray's logs, kept in the run folder, and no longer in Ray's /tmp folder: that was removed
    assert any((ray_dir / "ray" / "session_latest" / "logs").rglob("*.log"))
    assert (ray_dir / "ray" / "session_latest").resolve().is_relative_to(ray_dir.resolve())


def start_long_run(tiny_config, tmp_path, save_freq: int, reached):
    """A 40-step Ray run in the background, returned once ``reached(run_dir)`` holds."""
    run_dir = tmp_path / "run"
    overrides = [*STEPS, *RAY_2_CPU, "trainer.total_training_steps=40", f"trainer.save_freq={save_freq}",
                 "trainer.test_freq=-1", f"trainer.default_local_dir={run_dir}"]
    command = train_command(tiny_config(*overrides), tmp_path)
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.time() + 240
    while not reached(run_dir):
        assert proc.poll() is None and time.time() < deadline, "the run ended or stalled before step 2"
        time.sleep(0.2)
    return run_dir, command, proc


def test_a_killed_worker_and_a_ctrl_c_each_stop_the_run_and_the_same_command_resumes(tiny_config, tmp_path,
                                                                                     ctrl_c_raises):
    """One background run interrupted twice (sharing it saves a Ray start and a run).
    First a worker is killed: the run stops naming its rank and the last checkpoint. Then the
    resumed run, now with save_freq=-1 so that only Ctrl-C saves, gets a Ctrl-C: the driver's
    request reaches the controller, which finishes its step and saves it. The same command
    then resumes from there and finishes all 40 steps."""
    run_dir, command, proc = start_long_run(tiny_config, tmp_path, 1,
                                            lambda run: (run / "checkpoints" / "global_step_2").exists())
    rank1 = json.loads((run_dir / "workers.json").read_text())[1]
    os.kill(rank1["pid"], signal.SIGKILL)
    out = proc.communicate(timeout=120)[0]
    assert proc.returncode == 2, out[-3000:]
    assert "rank 1's worker process" in out and "died" in out, out[-3000:]
    assert "last checkpoint: " in out and "global_step_" in out and "run the same command again" in out
    assert "Traceback" not in out.split("rank 1's worker process")[-1]
    killed_at = max(int(p.name.rsplit("_", 1)[1]) for p in (run_dir / "checkpoints").glob("global_step_*"))
    assert 2 <= killed_at < 40

    only_ctrl_c_saves = [*command, "trainer.save_freq=-1"]
    lines_before = sum(1 for _ in open(run_dir / "metrics.jsonl"))
    proc = subprocess.Popen(only_ctrl_c_saves, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.time() + 240
    while sum(1 for _ in open(run_dir / "metrics.jsonl")) < lines_before + 2:
        assert proc.poll() is None and time.time() < deadline, "the resumed run ended or stalled"
        time.sleep(0.2)
    proc.send_signal(signal.SIGINT)
    out = proc.communicate(timeout=120)[0]
    assert proc.returncode == 130, out[-3000:]
    assert f"resumed from {run_dir / 'checkpoints' / f'global_step_{killed_at}'}" in out
    saved = sorted(int(p.name.rsplit("_", 1)[1]) for p in (run_dir / "checkpoints").glob("global_step_*"))
    interrupted_at = saved[-1]
    assert killed_at < interrupted_at < 40, out[-3000:]
    assert f"last checkpoint: {run_dir / 'checkpoints' / f'global_step_{interrupted_at}'}" in out

    done = subprocess.run(command, capture_output=True, text=True, timeout=400)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert f"resumed from {run_dir / 'checkpoints' / f'global_step_{interrupted_at}'}" in done.stdout
    steps = [r["step"] for r in records(run_dir)]
    assert steps[-1] == 40 and sorted(set(steps) - {0}) == list(range(1, 41))  # 0: validation before training


def test_a_rollout_on_workers_of_its_own_equals_the_hybrid_engine(tiny_config, tmp_path, in_process_run):
    """hybrid_engine=false: one actor worker and two rollout workers (3 logical CPUs on Ray); the
    rollout samples with the weights the actor sends after every update, its two ranks answering
    responses of different widths, so the run equals the hybrid one."""
    run_dir = tmp_path / "separate"
    config = tiny_config(*STEPS, "trainer.device=cpu", "actor_rollout_ref.hybrid_engine=false",
                         "actor_rollout_ref.rollout.n_gpus_per_node=2", "ray_kwargs.ray_init.num_cpus=3",
                         f"trainer.default_local_dir={run_dir}")
    done = subprocess.run(train_command(config, tmp_path), capture_output=True, text=True, timeout=400)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "rollout workers by gloo broadcast from the actor's rank 0 (127.0.0.1:" in done.stdout
    got = records(run_dir)
    assert all("timing_s/sync_weights" in r for r in got if r["step"] > 0)
    assert_same_metrics(got, records(in_process_run))
    assert_same_weights(final_weights(run_dir, 3), final_weights(in_process_run, 3))
    actor = json.loads((run_dir / "workers.json").read_text())
    rollout = json.loads((run_dir / "rollout_pool" / "workers.json").read_text())
    assert len(rollout) == 2 and {w["pid"] for w in actor}.isdisjoint({w["pid"] for w in rollout})  # their own


def test_one_step_off_on_rollout_workers_of_their_own_equals_the_in_process_run(tiny_config, tmp_path):
    """trainer.v1.trainer_mode=separate_async: the schedule of colocate_async on a rollout pool of
    its own (two Ray workers), the weights sent to them with their version; the run equals the
    one-step-off run in one process, and each step trains the batch the weights before the last
    update generated."""
    ahead = ["trainer.v1.colocate_async.num_warmup_batches=1"]
    local_dir, ray_dir = tmp_path / "local", tmp_path / "ray"
    run_training(tiny_config(*STEPS, *ahead, "trainer.v1.trainer_mode=colocate_async",
                             f"trainer.default_local_dir={local_dir}"))
    config = tiny_config(*STEPS, *ahead, "trainer.v1.trainer_mode=separate_async", "trainer.device=cpu",
                         "actor_rollout_ref.hybrid_engine=false", "actor_rollout_ref.rollout.n_gpus_per_node=2",
                         "ray_kwargs.ray_init.num_cpus=3", f"trainer.default_local_dir={ray_dir}")
    done = subprocess.run(train_command(config, tmp_path), capture_output=True, text=True, timeout=400)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "2 rollout workers by gloo broadcast" in done.stdout  # not through the driver
    got = records(ray_dir)
    assert_same_metrics(got, records(local_dir))
    assert [r["training/off_policy/trajectory_staleness/max"] for r in got[1:]] == [0, 1, 1]
    assert_same_weights(final_weights(ray_dir, 3), final_weights(local_dir, 3))


SCRIPTED_POOL_ENGINE = '''
"""In each process of the Ray run (its driver, the TaskRunner, the rollout pool's workers), the
native engine is the teacher-forced one of tests/conftest.py, scripted as in
tests/trainer/test_multi_turn_training.py: the first turn calls the calculator."""
import sys

sys.path.insert(0, {root!r})
from rlvr.rollout.base import ROLLOUTS
from tests.conftest import _TeacherForcedEngine
from tests.trainer.test_multi_turn_training import script

ROLLOUTS._entries["native"] = _TeacherForcedEngine.make(script, ROLLOUTS.get("native"))
'''


def test_one_step_off_multi_turn_on_rollout_workers_of_their_own_equals_the_in_process_run(
        tiny_config, tmp_path, scripted_engine):
    """separate_async with tools: the rollout pool's workers run each conversation (model turns,
    calculator calls) with the weights broadcast to them; the run equals colocate_async in one
    process, tool calls, masks, staleness and weights alike."""
    from rlvr.data.prepare import prepare_calculator
    from tests.trainer.test_multi_turn_training import script

    data = prepare_calculator(tmp_path / "calc", train_size=16, test_size=4)
    tools = [f"data.train_files=[{data['train']}]", f"data.val_files=[{data['test']}]", "data.max_prompt_length=320",
             "data.max_response_length=40", "data.return_raw_chat=true", "actor_rollout_ref.rollout.multi_turn.enable=true",
             "actor_rollout_ref.rollout.multi_turn.tool_config_path=calculator",
             "actor_rollout_ref.rollout.multi_turn.format=tag", "actor_rollout_ref.rollout.multi_turn.max_assistant_turns=2",
             "trainer.freshness_check_freq=-1",  # scripted calls are not the model's greedy tokens
             "trainer.v1.colocate_async.num_warmup_batches=1", "trainer.total_training_steps=3",
             "trainer.val_before_train=false", "trainer.save_freq=3", "data.train_batch_size=4",
             "actor_rollout_ref.actor.ppo_mini_batch_size=2"]
    local_dir, ray_dir = tmp_path / "local", tmp_path / "ray"
    scripted_engine(script)
    run_training(tiny_config(*tools, "trainer.v1.trainer_mode=colocate_async", f"trainer.default_local_dir={local_dir}"))
    config = tiny_config(*tools, "trainer.v1.trainer_mode=separate_async", "trainer.device=cpu",
                         "actor_rollout_ref.hybrid_engine=false", "actor_rollout_ref.rollout.n_gpus_per_node=2",
                         "ray_kwargs.ray_init.num_cpus=3", f"trainer.default_local_dir={ray_dir}")
    module = tmp_path / "scripted_pool_engine.py"
    module.write_text(SCRIPTED_POOL_ENGINE.format(root=str(Path(__file__).parents[2])))
    config_file = tmp_path / "config.yaml"  # the module only in the Ray run's processes, never in this one
    config_file.write_text(to_yaml(config).replace("custom_modules: []", f"custom_modules: [{module}]"))
    command = loopback_only([sys.executable, "-m", "rlvr.cli", "train", "--config", str(config_file)])
    done = subprocess.run(command, capture_output=True, text=True, timeout=400)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    got = records(ray_dir)
    assert all(r["multi_turn/tool_calls"] == 1.0 and r["multi_turn/tool_tokens/mean"] > 0 for r in got)
    assert [r["training/off_policy/trajectory_staleness/max"] for r in got] == [0, 1, 1]
    assert_same_metrics(got, records(local_dir))
    assert_same_weights(final_weights(ray_dir, 3), final_weights(local_dir, 3))


def test_vllm_on_rollout_workers_of_their_own_equals_the_in_process_engine(tiny_config, tmp_path, tiny_vllm_model_dir):
    """hybrid_engine=false with rollout.name=vllm: each of two Ray rollout workers runs a vLLM
    engine on the weights broadcast to it; one-step-off there equals colocate_async with vLLM in
    the trainer's process (rows are seeded by their place in the whole batch, so the split over
    workers changes no token)."""
    local_dir, ray_dir = tmp_path / "local", tmp_path / "ray"
    vllm = [*STEPS, f"actor_rollout_ref.model.path={tiny_vllm_model_dir}", "actor_rollout_ref.rollout.name=vllm",
            "trainer.v1.colocate_async.num_warmup_batches=1"]
    run_training(tiny_config(*vllm, "trainer.v1.trainer_mode=colocate_async", f"trainer.default_local_dir={local_dir}"))
    config = tiny_config(*vllm, "trainer.v1.trainer_mode=separate_async", "trainer.device=cpu",
                         "actor_rollout_ref.hybrid_engine=false", "actor_rollout_ref.rollout.n_gpus_per_node=2",
                         "ray_kwargs.ray_init.num_cpus=3", f"trainer.default_local_dir={ray_dir}")
    done = subprocess.run(train_command(config, tmp_path), capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "2 rollout workers by gloo broadcast" in done.stdout
    got = records(ray_dir)
    assert any(r.get("actor/grad_norm", 0) > 0 for r in got)
    assert_same_metrics(got, records(local_dir))
    assert_same_weights(final_weights(ray_dir, 3), final_weights(local_dir, 3))


def test_ppo_with_a_critic_colocated_on_two_ray_workers_equals_the_in_process_run(tiny_config, tmp_path):
    """GAE: actor-rollout-ref and the critic, both sharded with FSDP2, share each worker's process."""
    gae = ["algorithm.adv_estimator=gae", "critic.ppo_mini_batch_size=2", "critic.ppo_micro_batch_size_per_gpu=3",
           "critic.optim.lr=1e-3"]
    local_dir, ray_dir = tmp_path / "local", tmp_path / "ray"
    run_training(tiny_config(*STEPS, *gae, f"trainer.default_local_dir={local_dir}"))
    done = subprocess.run(train_command(tiny_config(*STEPS, *gae, *RAY_2_CPU, f"trainer.default_local_dir={ray_dir}"),
                                        tmp_path), capture_output=True, text=True, timeout=400)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    got = records(ray_dir)
    assert_same_metrics(got, records(local_dir))
    assert any(r.get("critic/grad_norm", 0) > 0 for r in got)
    critic = [load_file(d / "checkpoints" / "global_step_3" / "critic" / "model.safetensors") for d in (ray_dir, local_dir)]
    assert_same_weights(*critic)
    assert_same_weights(final_weights(ray_dir, 3), final_weights(local_dir, 3))


def test_remax_on_two_ray_workers_equals_the_in_process_run(tiny_config, tmp_path):
    """ReMax on 2 workers: the sampled rows stop early at different widths per rank, and the
    greedy pass (one row per prompt, 2 per rank) goes through the same collect; the baselines and
    the run are the one process's. (The tiny model's greedy rows all repeat the prompt's last
    token, so they have one width; the slow default-job test's greedy validation and the fake
    group's checks give that call uneven widths.)"""
    local_dir, ray_dir = tmp_path / "local", tmp_path / "ray"
    remax = [*STEPS, "algorithm.adv_estimator=remax", "trainer.test_freq=-1", "trainer.val_before_train=false"]
    run_training(tiny_config(*remax, f"trainer.default_local_dir={local_dir}"))
    done = subprocess.run(train_command(tiny_config(*remax, *RAY_2_CPU, f"trainer.default_local_dir={ray_dir}"),
                                        tmp_path), capture_output=True, text=True, timeout=400)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    got = records(ray_dir)
    assert all("timing_s/gen_max" in r for r in got)
    assert_same_metrics(got, records(local_dir))
    assert_same_weights(final_weights(ray_dir, 3), final_weights(local_dir, 3))


def test_vllm_over_two_ray_workers_equals_the_in_process_run(tiny_config, tmp_path, tiny_vllm_model_dir):
    """rollout.name=vllm under Ray, as verl's scripts run it: one engine spans both workers
    (tensor_model_parallel_size=2, vLLM's external launcher in each worker, each holding half of
    every layer), fed the weights gathered from the FSDP2 shards; rows are seeded by their place in
    the whole batch, so the workers sample the one process's tokens and the run (metrics, weights,
    validation) is the one process's. (An engine per worker: tests/distributed/test_fsdp_parity.py.)
    Stale or wrongly gathered weights, or seeds that followed the rank split, would sample others."""
    local_dir, ray_dir = tmp_path / "local", tmp_path / "ray"
    vllm = [*STEPS, f"actor_rollout_ref.model.path={tiny_vllm_model_dir}", "actor_rollout_ref.rollout.name=vllm"]
    run_training(tiny_config(*vllm, f"trainer.default_local_dir={local_dir}"))
    tp2 = "actor_rollout_ref.rollout.tensor_model_parallel_size=2"
    done = subprocess.run(train_command(tiny_config(*vllm, *RAY_2_CPU, tp2, f"trainer.default_local_dir={ray_dir}"),
                                        tmp_path), capture_output=True, text=True, timeout=400)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    got = records(ray_dir)
    assert any(r.get("actor/grad_norm", 0) > 0 for r in got)  # it trained
    assert_same_metrics(got, records(local_dir))
    assert_same_weights(final_weights(ray_dir, 3), final_weights(local_dir, 3))


def test_asking_for_more_than_the_cluster_has_fails_at_once_with_the_numbers(tiny_config, tmp_path):
    """4 CPU workers on a Ray of 2 CPUs: a clear error before any placement group waits."""
    config = tiny_config("trainer.device=cpu", "trainer.n_gpus_per_node=4", "actor_rollout_ref.actor.strategy=fsdp2",
                         "data.train_batch_size=4", "actor_rollout_ref.actor.ppo_mini_batch_size=4",
                         "ray_kwargs.ray_init.num_cpus=2", f"trainer.default_local_dir={tmp_path / 'run'}")
    started = time.time()
    done = subprocess.run(train_command(config, tmp_path), capture_output=True, text=True, timeout=300)
    assert done.returncode == 2, done.stdout[-2000:] + done.stderr[-2000:]
    assert "resource pool 'global_pool' needs 4 CPUs (the cluster has 2) for 4 workers" in done.stderr
    assert "Traceback" not in done.stderr and time.time() - started < 120


CUSTOM_MODULE = '''
import torch
from rlvr.algos import agg_loss, register_adv_est, register_policy_loss
from rlvr.rewards import register_reward_fn

@register_reward_fn("test_ray_quarters", needs_ground_truth=False)
def quarters(data_source, solution_str, ground_truth, extra_info=None):
    return 0.75 if len(solution_str) % 2 == 0 else 0.25

@register_adv_est("test_ray_sign")
def sign_advantage(token_level_rewards, response_mask, index, epsilon=1e-6, config=None):
    adv = torch.sign(token_level_rewards.sum(-1) - 0.5).unsqueeze(-1) * response_mask
    return adv, adv

@register_policy_loss("test_ray_marked")
def marked_loss(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode="token-mean", config=None,
                rollout_is_weights=None):
    zero = torch.zeros(())
    return agg_loss(-advantages * log_prob, response_mask, loss_agg_mode), torch.tensor(0.625), zero, zero
'''


def test_custom_modules_reach_the_task_runner_and_the_workers(tiny_config, tmp_path):
    """A reward function and an estimator registered in custom_modules are used in the TaskRunner,
    a policy loss in the workers: each process imports the file (the driver alone did before)."""
    module = tmp_path / "my_algos.py"
    module.write_text(CUSTOM_MODULE)
    run_dir = tmp_path / "run"
    config = tiny_config(*RAY_2_CPU, f"custom_modules=[{module}]", "reward.functions=[{name: test_ray_quarters}]",
                         "algorithm.adv_estimator=test_ray_sign",
                         "actor_rollout_ref.actor.policy_loss.loss_mode=test_ray_marked", "trainer.total_training_steps=1",
                         "trainer.val_before_train=false", "data.train_batch_size=4",
                         "actor_rollout_ref.actor.ppo_mini_batch_size=2", f"trainer.default_local_dir={run_dir}",
                         custom_reward=False)
    done = subprocess.run(train_command(config, tmp_path), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    (step,) = records(run_dir)
    assert step["actor/pg_clipfrac"] == pytest.approx(0.625)  # only the custom loss reports this clip fraction
    dumped = [json.loads(line) for line in open(run_dir / "rollouts" / "1.jsonl")]
    assert {r["score"] for r in dumped} <= {0.25, 0.75} and {r["advantage"] for r in dumped} <= {-1.0, 1.0}


def test_the_default_job_on_two_ray_workers_trains_on_rows_that_stop_at_eos(tmp_path, builtin_dir, tokenizer):
    """What a new user runs to scale out: ``rlvr train trainer.device=cpu trainer.n_gpus_per_node=2
    actor_rollout_ref.actor.strategy=fsdp2``, the built-in model on the arithmetic task, cut to 3
    small steps. The model ends its rows at EOS after different numbers of tokens, so the two
    workers answer responses of different widths; the run must train through them."""
    from rlvr.data.prepare import prepare_arithmetic

    data = prepare_arithmetic(tmp_path / "data", train_size=16, test_size=4)
    run_dir = tmp_path / "run"
    command = loopback_only([sys.executable, "-m", "rlvr.cli", "train", *RAY_2_CPU,
                             f"data.train_files=[{data['train']}]", f"data.val_files=[{data['test']}]",
                             "trainer.total_training_steps=3", "trainer.test_freq=3", "trainer.save_freq=3",
                             "data.train_batch_size=2", "actor_rollout_ref.rollout.n=4",
                             "data.max_response_length=48", "actor_rollout_ref.actor.ppo_mini_batch_size=2",
                             "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
                             "data.val_batch_size=4", "trainer.logger=[jsonl]", f"trainer.default_local_dir={run_dir}"])
    done = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    got = [r for r in records(run_dir) if r["step"] > 0]
    assert [r["step"] for r in got] == [1, 2, 3]
    # rows ended at EOS at different lengths within each batch, most before the limit
    assert all(r["response_length/min"] < r["response_length/max"] for r in got)
    # most rows end before the limit over the run (one step alone may clip more: which tokens are
    # drawn depends on the CPU's float reductions; on an AVX2-only EPYC a step clipped over half)
    clipped = [r["response_length/clip_ratio"] for r in got]
    assert sum(clipped) / len(clipped) < 0.5, clipped
    # and the two ranks' longest rows (rows 0-3 on rank 0, 4-7 on rank 1) differed in some step:
    # the widths that could not be joined before
    def longest(rows):
        return max(len(tokenizer.encode(r["response"], add_special_tokens=False)) for r in rows)
    dumps = [[json.loads(line) for line in open(run_dir / "rollouts" / f"{step}.jsonl")] for step in (1, 2, 3)]
    assert any(longest(rows[:4]) != longest(rows[4:]) for rows in dumps)
    assert "val-core/arithmetic/reward/mean@1" in got[-1]
    # it trained: a step had a gradient, and the saved weights moved away from the built-in model's
    assert any(r["actor/grad_norm"] > 0 for r in got)
    weights, initial = final_weights(run_dir, 3), load_file(Path(builtin_dir) / "model.safetensors")
    assert max(float((weights[k] - initial[k]).abs().max()) for k in initial if k in weights) > 0


SERVED_RUN = '''
import subprocess, sys, time
import httpx
from rlvr.distributed.worker import free_port

port = free_port()
server = subprocess.Popen([sys.executable, "-m", "rlvr.cli", "serve", "--host", "127.0.0.1", "--port", str(port),
                           "actor_rollout_ref.model.path=MODEL"], stdout=open("LOG", "w"), stderr=subprocess.STDOUT)
try:
    deadline = time.monotonic() + 120
    while True:
        assert server.poll() is None and time.monotonic() < deadline, "the server did not start; see LOG"
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=5).status_code == 200:
                break
        except httpx.HTTPError:
            time.sleep(0.2)
    done = subprocess.run([sys.executable, "-m", "rlvr.cli", "train", "--config", "CONFIG",
                           f"actor_rollout_ref.rollout.external_server_addresses=['127.0.0.1:{port}']"])
    print("VERSION", httpx.get(f"http://127.0.0.1:{port}/get_weight_version", timeout=5).json(), flush=True)
    sys.exit(done.returncode)
finally:
    server.terminate()
    server.wait(30)
'''


def test_two_ray_ranks_train_on_an_external_server(tiny_config, tmp_path, tiny_model_dir):
    """FSDP2 over 2 Ray ranks with rollout.mode=async and an external rlvr serve (started in the
    same loopback-only namespace, never stopped by the run): no rank holds an engine; rank 0
    gathers each version, the driver sends it on, and the server generates every step with the
    weights of the update before (steps 1 and 2's freshness probes: its greedy tokens are the
    actor's), the final validation with the last update's: version 3."""
    run_dir = tmp_path / "served"
    config = tiny_config(*STEPS, *RAY_2_CPU, "actor_rollout_ref.rollout.mode=async",
                         "actor_rollout_ref.rollout.external_server_addresses=['127.0.0.1:1']",  # the script's port
                         "actor_rollout_ref.rollout.server.weight_sync=disk", f"trainer.default_local_dir={run_dir}")
    (tmp_path / "config.yaml").write_text(to_yaml(config))
    script = tmp_path / "served_run.py"
    script.write_text(SERVED_RUN.replace("MODEL", str(tiny_model_dir)).replace("LOG", str(tmp_path / "server.log"))
                      .replace("CONFIG", str(tmp_path / "config.yaml")))
    done = subprocess.run(loopback_only([sys.executable, str(script)]), capture_output=True, text=True, timeout=500)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    got = records(run_dir)
    assert [r["step"] for r in got] == [0, 1, 2, 3]
    assert all(r["training/freshness/greedy_gap_max"] <= 1e-3 for r in got[1:3])
    assert got[-1]["rollout/servers_up"] == 1.0 and any(k.startswith("val-core/") for k in got[-1])
    assert "VERSION {'weight_version': '3'}" in done.stdout, done.stdout[-2000:]  # the server ran on after the run
    assert json.loads((run_dir / "workers.json").read_text())[1]["rank"] == 1


def test_replicas_as_ray_actors_lose_a_replica_and_no_group(tiny_config, tmp_path):
    """2 CPU ranks on Ray with rollout.mode=async and no external servers: the 2 rlvr serve replicas
    are started by Ray actors (servers.json says where, with their pids and logs in the run folder).
    One replica is SIGKILLed after step 1: the next weight update (or a request, if it lands
    mid-rollout) finds it gone and takes it out of the rotation, the run finishes its 5 steps on
    the other, and every step trains each of its scheduled groups once, n rows each."""
    run_dir = tmp_path / "run"
    config = tiny_config(*STEPS, *RAY_2_CPU, "actor_rollout_ref.rollout.mode=async",
                         "actor_rollout_ref.rollout.n_gpus_per_node=2", "actor_rollout_ref.rollout.server.retry_delay=0.1",
                         "trainer.total_training_steps=5", "trainer.test_freq=-1", "trainer.save_freq=-1",
                         f"trainer.default_local_dir={run_dir}")
    proc = subprocess.Popen(train_command(config, tmp_path), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.time() + 300
        while not (run_dir / "metrics.jsonl").exists() or sum(1 for _ in open(run_dir / "metrics.jsonl")) < 2:
            assert proc.poll() is None and time.time() < deadline, proc.stdout.read()[-3000:] if proc.poll() else ""
            time.sleep(0.1)
        servers = json.loads((run_dir / "servers.json").read_text())
        assert [s["index"] for s in servers] == [0, 1] and all(s["address"].startswith("127.0.0.1:") for s in servers)
        assert all(Path(s["log"]).parent == run_dir / "servers" for s in servers)
        os.kill(servers[1]["pid"], signal.SIGKILL)
        out = proc.communicate(timeout=300)[0]
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, out[-3000:]
    got = records(run_dir)
    assert [r["step"] for r in got] == [0, 1, 2, 3, 4, 5]
    assert got[1]["rollout/servers_up"] == 2.0 and got[-1]["rollout/servers_up"] == 1.0
    n, prompts = config.actor_rollout_ref.rollout.n, config.data.train_batch_size
    for step in range(1, 6):
        rows = [json.loads(line) for line in open(run_dir / "rollouts" / f"{step}.jsonl")]
        uids = [r["uid"] for r in rows]
        assert sorted(set(uids)) == sorted(f"{step}-0-{i}" for i in range(prompts)), step
        assert all(uids.count(u) == n for u in set(uids)), step
    assert all(not psutil_alive(s["pid"]) for s in servers)  # the survivor stopped with the run


def psutil_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"  # a zombie is gone
