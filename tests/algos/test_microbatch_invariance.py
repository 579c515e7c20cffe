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


@pytest.mark.parametrize("level", ["token", "sequence"])
def test_bypass_batch_normalised_weights_do_not_depend_on_the_split(setup, tiny_model_dir, monkeypatch, level):
    """Bypass mode, REINFORCE with ``rollout_is_batch_normalize``: the weights pi / pi_rollout are
    divided by their mean over the whole mini-batch, so the optimizer step's gradient is the same
    for micro-batches of 4, 2 and 1 rows. Here pi_rollout = pi x e^(offset) per row (offsets 0.3,
    -0.2, 0.1, -0.4, plus 0.05-scale noise per token): weights near e^-0.3 = 0.74, 1.22, 0.90, 1.49,
    whose micro-batch means (0.98 and 1.20 for halves) are not the mini-batch's (1.09).
    Failed before the fix: each micro-batch divided by its own mean (a 1-row micro-batch's token
    weights by their own mean, its sequence weight to exactly 1), and the gradients differed."""
    grads = {micro: bypass_gradient(setup, tiny_model_dir, monkeypatch, micro, level) for micro in (4, 2, 1)}
    assert grads[4].abs().max() > 0
    for micro in (2, 1):
        assert torch.allclose(grads[micro], grads[4], rtol=1e-7, atol=1e-10 * float(grads[4].abs().max())), micro


def test_bypass_ppo_clip_computes_its_weights_for_the_metrics_only(setup, tiny_model_dir, monkeypatch):
    """Bypass mode's PPO-clip: the clipped ratio is already pi / pi_rollout, so importance weights
    (rollout_is) are metrics, never applied to the loss, as in verl (its bypass loss passes
    rollout_is_weights=None to PPO-clip). The weights here are near e^-0.3 .. e^0.4, far from 1:
    applied, they changed the gradient (before: the actor multiplied them into the PPO-clip loss)."""
    clip = dict(loss_type="ppo_clip", rollout_is_batch_normalize=False)
    weighted = bypass_gradient(setup, tiny_model_dir, monkeypatch, 4, "token", **clip)
    plain = bypass_gradient(setup, tiny_model_dir, monkeypatch, 4, None, **clip)
    assert plain.abs().max() > 0 and torch.equal(weighted, plain)


def bypass_gradient(setup, model_dir, monkeypatch, micro: int, level: str | None, **rc) -> torch.Tensor:
    """One optimizer step of the actor (4 rows, each its own group, one mini-batch) in bypass mode
    with batch-normalised IS weights (REINFORCE, unless ``rc`` says otherwise); the accumulated
    gradient, read before clipping."""
    import numpy as np

    import rlvr.workers.actor as actor_module
    from rlvr.config.schema import AlgorithmConfig, OptimConfig, RolloutCorrectionConfig
    from rlvr.protocol import DataProto
    from rlvr.workers.actor import Actor, build_optimizer

    _, input_ids, attention_mask, response_mask, old, _, adv = setup
    model = load_model(model_dir).double()
    with torch.no_grad():
        logp = response_log_probs(model, input_ids, attention_mask)
    offsets = torch.tensor([0.3, -0.2, 0.1, -0.4], dtype=torch.float64)[:, None]
    rollout = (old + offsets) * response_mask  # pi_rollout: log pi + offset + noise (old - logp)
    data = DataProto.from_dict(
        {"input_ids": input_ids, "attention_mask": attention_mask, "responses": input_ids[:, P:],
         "position_ids": torch.arange(P + R).expand(4, P + R).clone(), "response_mask": response_mask.long(),
         "advantages": adv * response_mask, "old_log_probs": rollout},
        {"uid": np.array(["a", "b", "c", "d"], dtype=object)})
    assert not torch.allclose(rollout, logp)
    cfg = ActorConfig(ppo_mini_batch_size=4, ppo_micro_batch_size_per_gpu=micro, use_kl_loss=False,
                      entropy_coeff=0.0, share_prompt_forward=False, dtype="float64")
    algorithm = AlgorithmConfig(rollout_correction=RolloutCorrectionConfig(**{
        "bypass_mode": True, "loss_type": "reinforce", "rollout_is": level, "rollout_is_threshold": 5.0,
        "rollout_is_batch_normalize": True, **rc}))
    optimizer, _ = build_optimizer(model, OptimConfig(lr=1e-3), total_steps=1)
    actor = Actor(model, cfg, algorithm, optimizer=optimizer, pad_id=0, max_response_length=R)
    seen = []

    def record_then_skip(model, optimizer, grad_clip):
        seen.append(torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None]).clone())
        return 1.0, True

    monkeypatch.setattr(actor_module, "clip_and_step", record_then_skip)
    actor.update_policy(data)
    assert len(seen) == 1
    return seen[0]
