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
    # the tiny model's logits are small: the 16-bit tolerance is its floor, 0.25
    assert [m["training/freshness/greedy_gap_tolerance"] for m in steps] == [0.01 if dtype == "float32" else 0.25] * 3
    assert all(m["training/freshness/greedy_gap_max"] <= m["training/freshness/greedy_gap_tolerance"] for m in steps)


def test_the_16_bit_tolerance_is_two_bf16_steps_at_the_largest_logit(tiny_config):
    """A bf16 number near |z| is a multiple of 2^(floor(log2 |z|) - 7): 0.125 in [16, 32), 0.25 in
    [32, 64), 0.5 in [64, 128), 1 in [128, 256). Two such steps, at least 0.25; fp32 keeps 0.01."""
    bf16 = tiny_config("actor_rollout_ref.rollout.dtype=bfloat16")
    fp32 = tiny_config("actor_rollout_ref.rollout.dtype=float32")
    assert [freshness_tolerance(bf16, z) for z in (0.0, 3.0, 31.9, 32.0, 48.0, 100.0, -100.0, 200.0)] == \
        [0.25, 0.25, 0.25, 0.5, 0.5, 1.0, 1.0, 2.0]
    assert [freshness_tolerance(fp32, z) for z in (3.0, 100.0)] == [0.01, 0.01]


# Logits near 100, where a bf16 step is 0.5: every token 100, tokens B < A (ids) 109.76 and 110.24.
# The fp32 actor's argmax is A; in bf16 both round to 110 (the nearest multiple of 0.5), and the
# engine's argmax of the tie is the first, B: a gap of 110.24 - 109.76 = 0.48 logits from rounding alone.
B, A, C = 1000, 1001, 1002


def logits_near_100(favourites: dict[int, float]):
    """A forward hook on a head that replaces its logits by 100 everywhere, ``favourites`` (token ->
    logit) apart: the model's computation up to the head runs, the greedy choice is fixed."""
    def hook(module, inputs, out):
        pattern = torch.full((out.shape[-1],), 100.0)
        pattern[list(favourites)] = torch.tensor(list(favourites.values()))
        return torch.zeros_like(out) + pattern.to(out.dtype)  # in the head's dtype: bf16 in the engine
    return hook


def probe_with_logits_near_100(tiny_config, tmp_path, engine_favourites: dict[int, float]) -> dict[str, float]:
    """The probe at step 2 of a bf16 engine (a copy of the fp32 actor), with the actor's head
    hooked to ``{B: 109.76, A: 110.24, C: 105}`` and the engine's to ``engine_favourites``. The
    lean decode step computes the head from its weight, past the hook: off."""
    config = tiny_config("actor_rollout_ref.rollout.dtype=bfloat16", "actor_rollout_ref.rollout.lean_decode=false",
                         "trainer.freshness_check_freq=1", f"trainer.default_local_dir={tmp_path}")
    trainer = build_trainer(config, progress_bar=False)
    worker = trainer.wg.worker
    assert worker.rollout.model is not worker.actor.model  # a bf16 copy
    worker.actor.model.lm_head.register_forward_hook(logits_near_100({B: 109.76, A: 110.24, C: 105.0}))
    worker.rollout.model.lm_head.register_forward_hook(logits_near_100(engine_favourites))
    trainer.global_step = 2
    try:
        return trainer._check_freshness()
    finally:
        trainer.tracker.close()


def test_a_fresh_bf16_engine_with_logits_near_100_passes_the_probe(tiny_config, tmp_path):
    """The engine's logits are the actor's, in bf16: its greedy token B trails the actor's A by
    0.48, one rounding step's worth, which a fixed 0.25 took for stale weights; two bf16 steps at
    the largest |logit| (110.24: 2 x 0.5 = 1.0) let it pass."""
    got = probe_with_logits_near_100(tiny_config, tmp_path, {B: 109.76, A: 110.24, C: 105.0})
    assert got["training/freshness/max_abs_logit"] == pytest.approx(110.24, abs=1e-4)
    assert got["training/freshness/greedy_gap_tolerance"] == 1.0
    assert got["training/freshness/greedy_gap_max"] == pytest.approx(0.48, abs=2e-3)  # + T ln(1 + ~0) of the probe


def test_a_stale_bf16_engine_with_logits_near_100_still_stops_the_run(tiny_config, tmp_path):
    """An engine whose weights favour C, where the actor has 105: its greedy token trails the
    actor's A by 110.24 - 105 = 5.24 logits, past the 1.0 the rounding allows."""
    with pytest.raises(StopTraining, match=r"step 2: the rollout engine does not hold the actor's weights \(version 1\): "
                                           r"its greedy token 1 of prompt 1 .* trails the actor's own greedy token by "
                                           r"5.24 logits \(tolerance 1, from the actor's and the engine's dtypes and the "
                                           r"largest \|logit\|, 110\); 16 of 16 probe tokens differ"):
        probe_with_logits_near_100(tiny_config, tmp_path, {C: 110.24})


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
