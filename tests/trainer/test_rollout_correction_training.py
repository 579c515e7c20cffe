"""algorithm.rollout_correction through the trainer: a bf16 rollout copy beside the fp32 actor
makes pi_rollout differ from pi_old, so the weights, the rejection and bypass mode have
something to correct; rlvr's older algorithm.rollout_is* keys and verl's fully-async
use_rollout_log_probs land on the same keys."""

import pytest

from rlvr.config import load_config
from rlvr.trainer.main import build_trainer

BF16_ROLLOUT = ("actor_rollout_ref.rollout.dtype=bfloat16", "trainer.val_before_train=false", "data.val_files=[]",
                "actor_rollout_ref.actor.use_kl_loss=false", "actor_rollout_ref.actor.entropy_coeff=0")


def run(tiny_config, *overrides):
    from tests.trainer.test_learning import records_of

    trainer = build_trainer(tiny_config(*BF16_ROLLOUT, *overrides), progress_bar=False)
    trainer.fit()
    trainer.tracker.close()
    return trainer, records_of(trainer)


def test_decoupled_weights_and_rejection_reach_the_update(tiny_config, tmp_path):
    _, records = run(tiny_config, "algorithm.rollout_correction.rollout_is=token",
                     "algorithm.rollout_correction.rollout_rs=token_k3",
                     "algorithm.rollout_correction.rollout_rs_threshold=3e-7")
    first = records[0]
    assert first["rollout_corr/k3_kl"] > 0  # bf16 sampler, fp32 trainer: a real gap
    assert 0 < first["rollout_corr/rollout_is_mean"] < 2 and first["rollout_corr/rollout_is_max"] <= 2.0
    assert 0 < first["rollout_corr/rollout_rs_masked_fraction"] < 1  # k3 (mean 4e-7) past 3e-7 on some tokens, not all
    # every token rejected: k1 = log(pi_rollout / pi_old) is within +-0.002, never in [log 1.5, log 2]
    _, refused = run(tiny_config, "algorithm.rollout_correction.rollout_rs=token_k1",
                     "algorithm.rollout_correction.rollout_rs_threshold=1.5_2.0",
                     f"trainer.default_local_dir={tmp_path / 'refused'}")
    assert refused[0]["rollout_corr/rollout_rs_masked_fraction"] == 1.0
    # nothing carries loss, so no gradient (KL loss and entropy are off)
    assert refused[0]["actor/pg_loss"] == 0.0 and refused[0]["actor/grad_norm"] == 0.0


def test_bypass_mode_takes_pi_old_from_the_rollout(tiny_config, monkeypatch, tmp_path):
    trainer = build_trainer(tiny_config(*BF16_ROLLOUT, "algorithm.rollout_correction.bypass_mode=true",
                                        "actor_rollout_ref.actor.ppo_epochs=2",
                                        # the freshness probe scores its greedy tokens with the actor: not pi_old
                                        "trainer.freshness_check_freq=-1"), progress_bar=False)

    def no_pass(*args, **kwargs):
        raise AssertionError("bypass mode computed old_log_probs")

    monkeypatch.setattr(trainer.wg, "compute_log_prob", no_pass)
    trainer.fit()
    trainer.tracker.close()
    from tests.trainer.test_learning import records_of

    first = records_of(trainer)[0]
    assert "timing_s/old_log_prob" not in first
    # the first mini-batch's ratio is pi / pi_rollout, not 1: ppo_kl is the bf16 gap, measured by the actor
    assert first["actor/ppo_kl"] != 0.0 and first["rollout_corr/kl"] == pytest.approx(first["actor/ppo_kl"], rel=0.5)


def test_older_spellings_land_on_rollout_correction(tiny_config, capsys):
    cfg = tiny_config("algorithm.rollout_is=true", "algorithm.rollout_is_level=sequence",
                      "algorithm.rollout_is_threshold=3.0")
    rc = cfg.algorithm.rollout_correction
    assert (rc.rollout_is, rc.rollout_is_threshold) == ("sequence", 3.0)
    assert "read as algorithm.rollout_correction" in capsys.readouterr().err
    assert tiny_config("algorithm.rollout_is=false").algorithm.rollout_correction.rollout_is is None
    assert load_config(None, ["async_training.use_rollout_log_probs=true", "async_training.staleness_threshold=1"]
                       ).algorithm.rollout_correction.bypass_mode is True


@pytest.mark.parametrize("override, message", [
    ("algorithm.rollout_correction.rollout_is=tokens", "rollout_is = 'tokens'"),
    ("algorithm.rollout_correction.rollout_is_threshold=2.0_0.5", "lower <= upper"),
    ("algorithm.rollout_correction.rollout_rs=token_k1", "needs rollout_rs_threshold"),
    ("algorithm.rollout_correction.rollout_rs_threshold=0.1", "no effect without"),
    ("algorithm.rollout_correction.loss_type=reinforce", "set algorithm.rollout_correction.bypass_mode=true"),
    ("algorithm.rollout_correction.rollout_is_batch_normalize=true", "no effect without"),
])
def test_settings_that_cannot_act_are_refused(tiny_config, override, message):
    from rlvr.config.validate import ConfigError

    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace("*", r"\*")):
        tiny_config(override, "algorithm.rollout_correction.rollout_is=token"
                    if "threshold=2.0_0.5" in override else "trainer.total_training_steps=2")


def test_bypass_ppo_clip_loads_its_weights_as_metrics(tiny_config, capsys):
    """Refused before, as weights that would count the correction twice; verl computes them for its
    metrics only under ppo_clip, and so does the actor now."""
    config = tiny_config("algorithm.rollout_correction.bypass_mode=true", "algorithm.rollout_correction.rollout_is=token")
    assert config.algorithm.rollout_correction.rollout_is == "token"
    assert "computed for the rollout_corr/ metrics only and not applied" in capsys.readouterr().err
