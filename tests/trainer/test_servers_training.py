"""Training on rollout servers (``rollout.mode=async``): ``rlvr serve`` replicas that the run
starts on free loopback ports and stops with it. The reward rises as it does in process (a
replica that kept its first weights would keep sampling the first policy), and greedy
validation through the servers equals the in-process engine's."""

import json

import pytest
import torch

from rlvr.trainer.main import build_trainer
from tests.trainer.test_learning import LEADING_SPACE, LEARN, train

ASYNC = ("actor_rollout_ref.rollout.mode=async", "actor_rollout_ref.rollout.server.retry_delay=0.1")


@pytest.mark.slow  # 15 s on the 2-core machine
def test_reward_rises_on_two_rlvr_serve_replicas(tiny_config, tmp_path):
    """The in-process learning test's task on two replicas for 10 steps. Samples differ from the
    in-process engine's (each group draws its own seed's rows), so the path does too (measured:
    0.56, 0.25, 0.31, 0.94, 0.81, 0.69, 1.0, 1.0, 1.0, 1.0); a replica that kept its first
    weights would keep sampling the first policy, about 0.6."""
    trainer, records = train(tiny_config, tmp_path, LEADING_SPACE, *LEARN, *ASYNC,
                             "actor_rollout_ref.rollout.n_gpus_per_node=2",
                             "actor_rollout_ref.actor.optim.lr=1e-1", "trainer.total_training_steps=10")
    scores = [r["critic/score/mean"] for r in records]
    assert scores[0] < 0.8, scores
    assert min(scores[-3:]) >= 0.9, scores
    rollout = trainer.wg.worker.rollout
    assert rollout.stats.weight_syncs == 10 and rollout.version == 9  # the step's weights, every step
    assert all(r.process.poll() is not None for r in rollout.replicas)  # stopped with the run
    assert sum(r["rollout/server_retries"] for r in records) == 0.0
    assert all(r["rollout/servers_up"] == 2.0 for r in records)


@pytest.mark.slow
def test_greedy_validation_on_a_server_equals_the_in_process_engine(tiny_config, tmp_path, builtin_dir):
    """The validation pass (greedy, every test prompt) through one replica gives the in-process
    engine's response tokens and metrics, on the built-in model (the random tiny model answers
    every chat prompt with the template's last token, which would compare nothing)."""
    results = {}
    for mode in ("sync", "async"):
        cfg = tiny_config(f"actor_rollout_ref.rollout.mode={mode}", f"trainer.default_local_dir={tmp_path / mode}",
                          "data.max_response_length=16", f"actor_rollout_ref.model.path={builtin_dir}",
                          "actor_rollout_ref.actor.use_kl_loss=false")
        trainer = build_trainer(cfg, progress_bar=False)
        generated = []
        generate = trainer.rollout_wg.generate_sequences

        def recording(batch, generate=generate, generated=generated):
            out = generate(batch)
            generated.append(out.batch["responses"].clone())
            return out

        trainer.rollout_wg.generate_sequences = recording
        try:
            metrics = trainer.validate()
        finally:
            trainer.wg.shutdown()
            trainer.tracker.close()
        results[mode] = ({k: v for k, v in metrics.items() if k.startswith("val-")}, generated)
    (sync_metrics, sync_out), (async_metrics, async_out) = results["sync"], results["async"]
    assert sync_metrics and sync_metrics == async_metrics
    assert len(sync_out) == len(async_out) > 0
    for a, b in zip(sync_out, async_out):
        assert torch.equal(a, b)
    assert int((sync_out[0] != sync_out[0][:, :1]).sum()) > 0  # responses that differ: a real comparison


@pytest.mark.slow
def test_reward_rises_on_a_vllm_serve_replica(tiny_config, tmp_path, tiny_vllm_model_dir):
    """rollout.name=vllm with mode=async: one `vllm serve` replica, its weights reloaded from disk
    after every update. A replica that kept its first weights would keep sampling the first policy
    (a score near 0.5, never all 16 rows), and the freshness probe of the last step (the replica's
    greedy tokens scored by the actor) would find the first policy's argmax, not the actor's: the
    run would stop there.

    The replica prefills whole prompts, so each request carries its seed and the path repeats
    (measured twice: 0.5, 0.56, 0.75, 0.56, 0.31, 0.56, 0.06, 1.0, 1.0, 1.0). Before, vLLM's CPU
    requests went unseeded and the path differed run to run; one CI run never reached all 16 rows
    (0.56, 0.38, 0.44, 0.13, 0.44, then 0.0), lr 1e-1 stepping to a deterministic wrong first token."""
    trainer, records = train(tiny_config, tmp_path, LEADING_SPACE, *LEARN, *ASYNC,
                             "actor_rollout_ref.rollout.name=vllm", f"actor_rollout_ref.model.path={tiny_vllm_model_dir}",
                             "actor_rollout_ref.actor.optim.lr=1e-1", "trainer.total_training_steps=10")
    scores = [r["critic/score/mean"] for r in records]
    assert scores[0] < 0.8, scores
    assert max(scores[2:]) == 1.0, scores  # all 16 rows: p = 2^-16 a step for the first policy's coin flips
    assert records[-1]["training/freshness/greedy_gap_max"] <= 1e-3  # the last step's probe: the actor's argmax
    assert trainer.wg.worker.rollout.stats.weight_syncs == 10


@pytest.mark.slow
@pytest.mark.parametrize("name", ["native", "vllm"])
def test_the_default_jobs_first_two_steps_on_one_replica(name, tmp_path):
    """The built-in task and recipe (the built-in model, 64 rows a step) on one replica of each
    kind: two steps whose weights reach the replica, finite losses, a score in [0, 1]."""
    from rlvr.config import load_config

    cfg = load_config(None, [f"trainer.default_local_dir={tmp_path}", "trainer.total_training_steps=2",
                             "trainer.val_before_train=false", "trainer.test_freq=-1", "trainer.save_freq=-1",
                             "actor_rollout_ref.rollout.mode=async", f"actor_rollout_ref.rollout.name={name}",
                             "trainer.logger=[jsonl]"])
    trainer = build_trainer(cfg, progress_bar=False)
    trainer.fit()
    trainer.tracker.close()
    records = [json.loads(line) for line in open(tmp_path / "metrics.jsonl")]
    assert len(records) == 2 and trainer.wg.worker.rollout.stats.weight_syncs == 2
    assert all(0.0 <= r["critic/score/mean"] <= 1.0 and r["response_length/mean"] > 1 for r in records)
    assert records[0]["training/freshness/greedy_gap_max"] <= 1e-3  # the replica's greedy tokens are the actor's


@pytest.mark.slow  # 18 s: make test stays under 15 minutes
def test_ctrl_c_stops_the_replicas_and_resume_starts_new_ones(tiny_config, tmp_path, interrupt_and_resume):
    """Ctrl-C in step 2: the run saves step 1 and stops the replicas it started (by pid); running
    the same command again resumes with replicas of its own and finishes."""
    cfg = tiny_config(*ASYNC, "trainer.total_training_steps=3")
    trainer = build_trainer(cfg, progress_bar=False)
    first = trainer.wg.worker.rollout
    resumed = interrupt_and_resume(trainer, 2, "saved step 1")
    assert all(r.process.poll() is not None for r in first.replicas)
    second = resumed.wg.worker.rollout
    assert second is not first and resumed.global_step == 3
    assert all(r.process.poll() is not None for r in second.replicas)
    assert {r.process.pid for r in second.replicas}.isdisjoint(r.process.pid for r in first.replicas)


def test_every_replica_down_saves_the_last_step_and_stops_with_the_reason(tiny_config, tmp_path):
    """Both replicas killed before step 2's rollout: the run saves step 1, as Ctrl-C does, and
    stops naming each replica and why it is out."""
    import os
    import signal

    from rlvr.errors import RolloutUnavailable
    from rlvr.trainer import checkpoint

    cfg = tiny_config(*ASYNC, "actor_rollout_ref.rollout.n_gpus_per_node=2", "trainer.total_training_steps=3",
                      "trainer.save_freq=-1")
    trainer = build_trainer(cfg, progress_bar=False)
    rollout = trainer.wg.worker.rollout
    generate = rollout.generate

    def killing(*args, **kwargs):
        if trainer.global_step == 2:
            for r in rollout.replicas:
                if r.process.poll() is None:
                    os.kill(r.process.pid, signal.SIGKILL)
                    r.process.wait(10)
        return generate(*args, **kwargs)

    rollout.generate = killing
    with pytest.raises(RolloutUnavailable, match=r"(?s)replica 0 .*ConnectError.*replica 1 .*saved step 1"):
        trainer.fit()
    trainer.tracker.close()
    assert checkpoint.latest_checkpoint(checkpoint.checkpoint_root(cfg)).name == "global_step_1"


# ---------------------------------------------------------------- the trainer.v1 modes and a rollout of its own
AHEAD = ("trainer.v1.trainer_mode=colocate_async", "trainer.val_before_train=false", "trainer.test_freq=-1",
         "trainer.total_training_steps=4", "actor_rollout_ref.actor.ppo_mini_batch_size=2")


def served_versions(trainer):
    """Record, per generation, the versions every row's server reported (``weight_version``)."""
    seen = []
    engine = trainer.rollout_wg.worker
    generate = engine.generate_sequences

    def recording(prompts):
        out = generate(prompts)
        seen.append(sorted(set(out.non_tensor_batch["weight_version"].tolist())))
        return out

    engine.generate_sequences = recording
    return seen


# the servers' reported versions at each generation, in dispatch order: batch g by max(0, g - 1 - k), the
# freshness probes of steps 1 and 2 by the actor's version then (0, 1), each after the batches queued before it.
# k = 1: batches 1, 2 (v0), probe 1 (v0), batch 3 (v1, sent at step 2), probe 2 (v1), batch 4 (v2)
# k = 2: batches 1, 2, 3 (v0), probe 1 (v0), batch 4 (v1), probe 2 (v1)
SCHEDULE = {1: [0, 0, 0, 1, 1, 2], 2: [0, 0, 0, 0, 1, 1]}


@pytest.mark.parametrize("mode, ahead", [pytest.param("colocate_async", 1, marks=pytest.mark.slow),  # 15 s
                                         ("colocate_async", 2), ("separate_async", 1)])
def test_generating_ahead_on_servers_follows_the_schedule(tiny_config, tmp_path, mode, ahead):
    """The trainer.v1 modes on two rlvr serve replicas (separate_async: hybrid_engine=false, the
    servers being the rollout's own devices, no Ray): batch g is generated by servers holding
    version max(0, g - 1 - k), as they report it on every row and as the trainer stamps it; the
    actor's worker holds no engine; the freshness probes at steps 1 and 2 (the servers' greedy
    tokens against the actor's) pass. A driver that sent no weights, or the newest, would show
    other reported versions."""
    from rlvr.config.validate import uses_ray
    from tests.trainer.test_async import dumped, records

    cfg = tiny_config(*ASYNC, *AHEAD, f"trainer.v1.trainer_mode={mode}",
                      f"trainer.v1.colocate_async.num_warmup_batches={ahead}",
                      f"actor_rollout_ref.hybrid_engine={str(mode == 'colocate_async').lower()}",
                      "actor_rollout_ref.rollout.n_gpus_per_node=2", f"trainer.default_local_dir={tmp_path / 'run'}")
    assert not uses_ray(cfg)
    trainer = build_trainer(cfg, progress_bar=False)
    assert trainer.wg.worker.rollout is None
    rollout = trainer.rollout_wg.worker.rollout
    seen = served_versions(trainer)
    trainer.fit()
    trainer.tracker.close()
    assert seen == [[v] for v in SCHEDULE[ahead]]
    for g in range(1, 5):
        assert {r["policy_version"] for r in dumped(tmp_path / "run", g)} == {max(0, g - 1 - ahead)}, g
    got = records(tmp_path / "run")
    assert [r["training/off_policy/trajectory_staleness/max"] for r in got] == [min(g - 1, ahead) for g in range(1, 5)]
    assert [r["training/freshness/greedy_gap_max"] <= 1e-3 for r in got[:2]] == [True, True]
    assert all(r.process.poll() is not None for r in rollout.replicas)  # stopped with the run


def test_a_rollout_of_its_own_on_servers_gets_every_update(tiny_config, tmp_path):
    """hybrid_engine=false with trainer_mode=sync on one replica, without Ray: the driver in the
    trainer's process is sent the actor's weights after every update and sends them on, so the
    servers generate step g with version g - 1 (a driver that kept the first weights would
    report 0 throughout, and step 2's freshness probe would stop the run)."""
    from rlvr.config.validate import uses_ray

    cfg = tiny_config(*ASYNC, "actor_rollout_ref.hybrid_engine=false", "trainer.total_training_steps=3",
                      "trainer.val_before_train=false", "trainer.test_freq=-1")
    assert not uses_ray(cfg)
    trainer = build_trainer(cfg, progress_bar=False)
    seen = served_versions(trainer)
    trainer.fit()
    trainer.tracker.close()
    # step 1: probe and batch by v0; step 2: probe and batch by v1; step 3: batch by v2
    assert seen == [[0], [0], [1], [1], [2]]
    assert trainer.rollout_wg.worker.rollout.stats.weight_syncs == 3


@pytest.mark.slow  # 23 s: make test stays under 15 minutes
def test_one_step_off_on_servers_resumes_to_the_uninterrupted_run(tiny_config, tmp_path, interrupt_and_resume):
    """Ctrl-C at step 3 of a one-step-off run on a replica, then the same command again: the
    resumed run's records and samples equal the uninterrupted run's. The batch generated ahead
    before the interrupt is saved with the checkpoint and trained, not generated again; new
    replicas are started and sent the checkpoint's weights. The servers seed each group, so two
    runs sample the same tokens. Only the servers' own log-probs of those tokens (and the gaps
    measured from them) may differ, by float rounding (measured: 1e-7): a server batches requests
    as they arrive, and a batch's make-up changes the matmuls' blocking."""
    from tests.trainer.test_async import dumped, records, stable

    def same_run(record):
        return {k: v for k, v in stable(record).items()
                if not k.startswith(("training/rollout_", "training/freshness/log_prob_gap", "training/engine_parity/",
                                     "rollout/weight_sync_s"))}

    overrides = (*ASYNC, *AHEAD, "trainer.v1.colocate_async.num_warmup_batches=1")
    whole = build_trainer(tiny_config(*overrides, f"trainer.default_local_dir={tmp_path / 'whole'}"), progress_bar=False)
    whole.fit()
    whole.tracker.close()
    cut = build_trainer(tiny_config(*overrides, f"trainer.default_local_dir={tmp_path / 'cut'}"), progress_bar=False)
    resumed = interrupt_and_resume(cut, 3, "saved step 2")
    assert resumed.global_step == 4
    cut_records, whole_records = records(tmp_path / "cut"), records(tmp_path / "whole")
    differ = [(r["step"], k) for r, w in zip(cut_records, whole_records) for k in same_run(r) if same_run(w).get(k) != r[k]]
    assert not differ and len(cut_records) == len(whole_records), differ
    assert "actor/pg_loss" in same_run(cut_records[-1]) and len(cut_records) == 4
    for step in range(1, 5):
        assert dumped(tmp_path / "cut", step) == dumped(tmp_path / "whole", step), step
