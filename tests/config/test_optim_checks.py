"""The optimizer's settings are refused at load when AdamW cannot train with them: a learning
rate that is not a finite positive number, betas outside [0, 1), a negative weight decay. Each
once loaded, and the run ended later in NaN weights or an internal error (issue 47, §2)."""

import pytest

from rlvr.config import ConfigError, load_config


@pytest.mark.parametrize("section", ["actor_rollout_ref.actor", "critic"])
@pytest.mark.parametrize("value, reason", [
    ("nan", "must be a finite number > 0"), ("inf", "must be a finite number > 0"), ("-0.5", "must be a finite"),
])
def test_a_learning_rate_that_is_not_finite_and_positive_is_refused(section, value, reason):
    with pytest.raises(ConfigError, match=rf"{section}\.optim\.lr = {value} {reason}"):
        load_config(None, [f"{section}.optim.lr={value}"])


@pytest.mark.parametrize("betas", ["[0.9,1.0]", "[-0.1,0.999]", "[0.9]", "[0.9,nan]"])
def test_betas_outside_zero_one_are_refused(betas):
    # AdamW divides by 1 - beta2 ** t: beta2 = 1 divides by zero (torch raises only at the first step)
    with pytest.raises(ConfigError, match=r"actor_rollout_ref\.actor\.optim\.betas = .* two numbers in \[0, 1\)"):
        load_config(None, [f"actor_rollout_ref.actor.optim.betas={betas}"])


def test_a_negative_weight_decay_is_refused():
    with pytest.raises(ConfigError, match=r"actor_rollout_ref\.actor\.optim\.weight_decay = -0\.1 must be >= 0"):
        load_config(None, ["actor_rollout_ref.actor.optim.weight_decay=-0.1"])


def test_the_defaults_and_edge_values_load():
    # beta 0 (no momentum) and weight decay 0 are valid AdamW settings
    config = load_config(None, ["actor_rollout_ref.actor.optim.betas=[0.0,0.0]",
                                "actor_rollout_ref.actor.optim.weight_decay=0.0"])
    assert config.actor_rollout_ref.actor.optim.betas == [0.0, 0.0]
