"""The freshness probe (trainer.freshness_check_freq): the rollout engine's greedy tokens are the
actor's own, else the run stops (verl #7495, ms-swift #9855: a sampler that never receives the
new policy, and the run trains on)."""

import json

import pytest
import torch

from rlvr.config.validate import ConfigError
from rlvr.errors import StopTraining
from rlvr.rollout.engine import NativeRollout
from rlvr.trainer.main import build_trainer
from rlvr.trainer.guards import GAP_TEMPERATURE, freshness_tolerance

# a learning rate that moves the tiny model's greedy tokens within one update
MOVING = ["actor_rollout_ref.actor.optim.lr=0.05", "trainer.total_training_steps=3", "trainer.freshness_check_freq=1",
          "trainer.val_before_train=false", "trainer.test_freq=-1"]


def metrics(run_dir):
    return [json.loads(line) for line in open(run_dir / "metrics.jsonl")]


def test_the_gap_temperature_turns_log_probs_into_the_logit_gap_to_the_argmax():
    # logits (3.0, 2.5, -1.0): token 1's gap to the argmax is 0.5; -T log softmax(z/T)[1] at T = 1e-4:
    # (3.0 - 2.5) + T ln(1 + e^{-0.5/T} + e^{-4/T}) = 0.5 + ~0; token 0's: T ln(1 + e^{-5000} + ...) = ~0
    z = torch.tensor([3.0, 2.5, -1.0])
    gap = -GAP_TEMPERATURE * torch.log_softmax(z / GAP_TEMPERATURE, -1)
    assert gap[1].item() == pytest.approx(0.5, abs=1e-6) and gap[0].item() == pytest.approx(0.0, abs=1e-6)
    assert gap[2].item() == pytest.approx(4.0, abs=1e-6)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_a_fresh_engine_passes_the_probe_at_every_step(tiny_config, tmp_path, dtype):
    """The engine shares the actor's tensors (fp32) or holds a bf16 copy refreshed at every sync:
    its greedy tokens are the actor's, within the tolerance of the two precisions, while the
    policy moves (the stale runs below, with the same learning rate, fail)."""
    config = tiny_config(*MOVING, f"actor_rollout_ref.rollout.dtype={dtype}", f"trainer.default_local_dir={tmp_path}")
    trainer = build_trainer(config, progress_bar=False)
    trainer.fit()
    trainer.tracker.close()
    steps = [m for m in metrics(tmp_path) if "training/freshness/greedy_gap_max" in m]
    assert [m["step"] for m in steps] == [1, 2, 3]
    assert all(m["training/freshness/probe_tokens"] > 0 for m in steps)
    assert max(m["training/freshness/greedy_gap_max"] for m in steps) <= freshness_tolerance(config)
    assert freshness_tolerance(config) == (0.01 if dtype == "float32" else 0.25)


def test_an_engine_whose_copy_never_syncs_stops_the_run(tiny_config, tmp_path, monkeypatch):
    """The engine keeps a copy of the initial weights (as an engine of its own dtype, a LoRA merge
    or a gathered FSDP2 copy would if its sync were lost): a probe finds greedy tokens the updated
    actor does not choose (here at step 3, two updates on: after one, the gap was still within
    the bf16 tolerance)."""
    monkeypatch.setattr(NativeRollout, "sync_weights", lambda self, version=None: None)
    config = tiny_config(*MOVING, "actor_rollout_ref.rollout.dtype=bfloat16", f"trainer.default_local_dir={tmp_path}")
    trainer = build_trainer(config, progress_bar=False)
    with pytest.raises(StopTraining, match=r"step [23]: the rollout engine does not hold the actor's weights \(version [12]\): "
                                           r"its greedy token \d+ of prompt \d+ .* trails the actor's own greedy token by "
                                           r"[\d.]+ logits \(tolerance 0.25"):
        trainer.fit()
    trainer.tracker.close()


def test_an_async_engine_stamped_with_the_right_version_but_stale_weights_stops_the_run(tiny_config, tmp_path):
    """colocate_async: each load stamps the version it was sent but its weights never arrive.
    The version check passes (the stamp is right); the probe does not."""
    config = tiny_config(*MOVING, "trainer.v1.trainer_mode=colocate_async",
                         "trainer.v1.colocate_async.num_warmup_batches=1", f"trainer.default_local_dir={tmp_path}")
    trainer = build_trainer(config, progress_bar=False)
    worker = trainer.rollout_wg.worker if hasattr(trainer.rollout_wg, "worker") else trainer.rollout_wg

    def stamp_only(weights, version=None):
        worker.version = version
    worker.update_weights = stamp_only
    with pytest.raises(StopTraining, match=r"step 2: the rollout engine does not hold the actor's weights \(version 1\)"):
        trainer.fit()
    trainer.tracker.close()


def test_the_probe_is_off_at_minus_one_and_a_zero_frequency_is_refused(tiny_config, tmp_path, monkeypatch):
    monkeypatch.setattr(NativeRollout, "sync_weights", lambda self, version=None: None)
    config = tiny_config(*MOVING[:-3], "trainer.freshness_check_freq=-1", "actor_rollout_ref.rollout.dtype=bfloat16",
                         f"trainer.default_local_dir={tmp_path}")
    trainer = build_trainer(config, progress_bar=False)
    trainer.fit()  # the stale engine trains on: nothing probes it
    trainer.tracker.close()
    assert not any("training/freshness/greedy_gap_max" in m for m in metrics(tmp_path))
    with pytest.raises(ConfigError, match=r"trainer.freshness_check_freq = 0: set a number of steps >= 1, or -1"):
        tiny_config("trainer.freshness_check_freq=0")
