"""TRL #6789 (https://github.com/huggingface/trl/issues/6789): with top_p / top_k / min_p
truncating the sampler, vLLM's log-probs are over the kept tokens, renormalised, while the
trainer's are over the whole vocabulary; the importance ratio pi_trainer / pi_rollout is then the
kept mass S at every token, which the rollout correction reads as policy drift.

Here the closed form on rlvr's own sampler (S = 0.90 at every sampled token), and the config that
would feed such ratios to the rollout correction refused at load.
"""

import pytest
import torch

from rlvr.config import load_config
from rlvr.config.validate import ConfigError
from rlvr.models.logits import log_probs_from_logits
from rlvr.rollout.sampling import SamplingParams, sample_tokens


def test_the_ratio_of_trainer_to_sampler_log_probs_is_the_kept_mass():
    """fails when ``sample_tokens`` (rlvr/rollout/sampling.py) stops renormalising the reported
    log-prob over the kept tokens (the ``- torch.log(kept.sum(...))``): the ratio then reads 1.

    Probabilities 0.5, 0.4, 0.06, 0.04 and top_p 0.85: the mass before token 1 is 0.5 <= 0.85 (kept),
    before token 2 it is 0.9 > 0.85 (dropped), so S = 0.5 + 0.4 = 0.90. The sampler draws from
    (0.5, 0.4) / 0.9 and reports log(p / 0.9); the trainer's log-prob is log p; exp(log p - log(p / 0.9))
    = 0.9 whichever token was drawn. (top_p 0.85, not 0.9: at 0.9 the mass before token 2 is exactly
    top_p, a tie the sampler resolves by keeping token 2.)"""
    logits = torch.log(torch.tensor([0.5, 0.4, 0.06, 0.04])).repeat(90, 1)  # (90, V=4)
    uniforms = (torch.arange(1, 91, dtype=torch.float64) - 0.5) / 90  # (90,): 0.5/90 .. 89.5/90
    tokens, rollout_log_probs = sample_tokens(logits, SamplingParams(max_new_tokens=1, top_p=0.85), uniforms)
    # inverse CDF over (0.5, 0.4): token 0 while u * 0.9 <= 0.5, i.e. u <= 50/90: 50 draws, token 1: 40
    assert torch.bincount(tokens, minlength=4).tolist() == [50, 40, 0, 0]
    trainer_log_probs = log_probs_from_logits(logits, tokens)  # (90,) over the whole vocabulary
    ratio = (trainer_log_probs - rollout_log_probs).exp()
    torch.testing.assert_close(ratio, torch.full((90,), 0.90), atol=1e-6, rtol=0)


@pytest.mark.parametrize("correction", ["algorithm.rollout_correction.rollout_is=token",
                                        "algorithm.rollout_correction.bypass_mode=true"])
@pytest.mark.parametrize("truncation", ["actor_rollout_ref.rollout.top_p=0.9", "actor_rollout_ref.rollout.top_k=20"])
def test_rollout_correction_with_truncated_sampling_is_refused_at_load(correction, truncation):
    """fails when the truncated-sampling check in ``_rollout_correction`` (rlvr/config/validate.py)
    is removed."""
    with pytest.raises(ConfigError, match=r"truncated sampling .* off by the kept mass S"):
        load_config(None, [truncation, correction])
    load_config(None, [truncation])  # truncated sampling alone trains (without a ratio to the rollout)
    load_config(None, [correction])  # and so does the correction of untruncated samples
