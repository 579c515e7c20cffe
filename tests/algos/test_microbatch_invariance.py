"""End to end on the tiny model: one optimizer step's gradient does not depend on how the
mini-batch is split into micro-batches, for every aggregation mode and policy loss."""

import pytest
import torch

from rlvr.algos import agg_loss, get_policy_loss_fn, kl_penalty
from rlvr.algos.losses import LOSS_AGG_MODES
from rlvr.config.schema import ActorConfig
from rlvr.models import load_model
from rlvr.models.logits import log_probs_from_logits

P, R = 5, 6  # prompt and response lengths (responses right-padded)


@pytest.fixture(scope="module")
def setup(tiny_model_dir):
    model = load_model(tiny_model_dir).double().train()
    g = torch.Generator().manual_seed(0)
    input_ids = torch.randint(3, 1000, (4, P + R), generator=g)
    lengths = torch.tensor([6, 2, 4, 1])
    response_mask = (torch.arange(R)[None] < lengths[:, None]).double()  # (4, R)
    attention_mask = torch.cat([torch.ones(4, P), response_mask], dim=1).long()
    with torch.no_grad():
        logp = response_log_probs(model, input_ids, attention_mask)
    old = logp + 0.05 * torch.randn(logp.shape, generator=g, dtype=torch.float64)
    ref = logp + 0.05 * torch.randn(logp.shape, generator=g, dtype=torch.float64)
    adv = torch.randn(4, 1, generator=g, dtype=torch.float64).expand(4, R)
    return model, input_ids, attention_mask, response_mask, old, ref, adv


def response_log_probs(model, input_ids, attention_mask):
    logits = model(input_ids=input_ids, attention_mask=attention_mask).logits[:, P - 1:-1]  # predicts responses
    return log_probs_from_logits(logits, input_ids[:, P:])


def step_gradient(setup, micro: int, mode: str, loss_mode: str):
    model, input_ids, attention_mask, response_mask, old, ref, adv = setup
    model.zero_grad()
    num_tokens, num_seqs = response_mask.sum(), response_mask.shape[0]
    cfg = ActorConfig(clip_ratio=0.2)
    for s in range(0, 4, micro):
        sl = slice(s, s + micro)
        logp = response_log_probs(model, input_ids[sl], attention_mask[sl])
        totals = dict(num_tokens=num_tokens, num_seqs=num_seqs, norm_constant=R)
        pg_loss, *_ = get_policy_loss_fn(loss_mode)(old[sl], logp, adv[sl], response_mask[sl], mode, cfg, **totals)
        kl = agg_loss(kl_penalty(logp, ref[sl], "low_var_kl"), response_mask[sl], mode, **totals)
        (pg_loss + 0.1 * kl).backward()  # micro-batch losses sum to the mini-batch loss
    return torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
def test_gradient_invariant_to_micro_batch_size(setup, mode):
    full = step_gradient(setup, 4, mode, "vanilla")
    assert full.abs().max() > 0
    for micro in (1, 2):
        assert torch.allclose(step_gradient(setup, micro, mode, "vanilla"), full, rtol=1e-8, atol=1e-12)


@pytest.mark.parametrize("loss_mode", ["gspo", "cispo", "gpg", "geo_mean", "sapo"])
def test_other_losses_invariant_to_micro_batch_size(setup, loss_mode):
    full = step_gradient(setup, 4, "token-mean", loss_mode)
    assert torch.allclose(step_gradient(setup, 1, "token-mean", loss_mode), full, rtol=1e-8, atol=1e-12)


def test_plain_token_mean_per_micro_batch_would_differ(setup):
    """The reason for num_tokens: averaging each micro-batch on its own weights tokens unequally."""
    model, input_ids, attention_mask, response_mask, old, ref, adv = setup
    full = step_gradient(setup, 4, "token-mean", "vanilla")
    model.zero_grad()
    for s in range(0, 4, 2):
        sl = slice(s, s + 2)
        logp = response_log_probs(model, input_ids[sl], attention_mask[sl])
        pg_loss, *_ = get_policy_loss_fn("vanilla")(old[sl], logp, adv[sl], response_mask[sl], "token-mean",
                                                    ActorConfig())
        kl = agg_loss(kl_penalty(logp, ref[sl], "low_var_kl"), response_mask[sl], "token-mean")
        ((pg_loss + 0.1 * kl) / 2).backward()
    naive = torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])
    assert not torch.allclose(naive, full, rtol=1e-4)
