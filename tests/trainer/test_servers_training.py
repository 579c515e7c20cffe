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
    after every update (a replica that kept its first weights would keep sampling the first policy)."""
    trainer, records = train(tiny_config, tmp_path, LEADING_SPACE, *LEARN, *ASYNC,
                             "actor_rollout_ref.rollout.name=vllm", f"actor_rollout_ref.model.path={tiny_vllm_model_dir}",
                             "actor_rollout_ref.actor.optim.lr=1e-1", "trainer.total_training_steps=10")
    scores = [r["critic/score/mean"] for r in records]
    assert scores[0] < 0.8, scores
    assert min(scores[-3:]) >= 0.9, scores
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
