"""``rlvr train --explain``: the objective a config resolves to, before anything loads.

One card per run: what a step samples and how many optimizer steps it takes; the advantage
estimator and its normalisation; the loss aggregation; the KL term and where it applies; how
far the update goes off-policy (epochs x mini-batches, plus the async engine's staleness),
with a warning where sources stack; the importance-sampling regime; whether truncated
sampling changes the ratio; on-policy distillation's term and how it joins the loss; keys that are
set but inert on the active path; and the defaults that differ from verl's. Each warning is a line starting with ``!``.
"""

from __future__ import annotations

from dataclasses import dataclass

from rlvr.algos.distillation import get_distillation_loss
from rlvr.algos.losses import OWN_AGGREGATION
from rlvr.config.schema import RLVRConfig
from rlvr.config.validate import teacher_entries

# verl's defaults (verl/trainer/config/_generated_ppo_trainer.yaml, verl 0.9) for the keys that
# shape the objective; rlvr's recipe values differing from them are listed on the card
VERL_DEFAULTS = {
    "actor_rollout_ref.rollout.n": 1,
    "actor_rollout_ref.rollout.temperature": 1.0,
    "actor_rollout_ref.rollout.top_p": 1.0,
    "actor_rollout_ref.rollout.top_k": -1,
    "actor_rollout_ref.actor.loss_agg_mode": "token-mean",
    "actor_rollout_ref.actor.use_kl_loss": False,
    "actor_rollout_ref.actor.kl_loss_coef": 0.001,
    "actor_rollout_ref.actor.kl_loss_type": "low_var_kl",
    "actor_rollout_ref.actor.entropy_coeff": 0.0,
    "actor_rollout_ref.actor.clip_ratio": 0.2,
    "actor_rollout_ref.actor.clip_ratio_c": 3.0,
    "actor_rollout_ref.actor.ppo_epochs": 1,
    "actor_rollout_ref.actor.optim.lr": 1e-6,
    "actor_rollout_ref.actor.optim.weight_decay": 0.01,
    "actor_rollout_ref.actor.grad_clip": 1.0,
    "actor_rollout_ref.actor.policy_loss.loss_mode": "vanilla",
    "actor_rollout_ref.actor.shuffle": False,
    "algorithm.adv_estimator": "gae",
    "algorithm.norm_adv_by_std_in_grpo": True,
    "algorithm.use_kl_in_reward": False,
    "algorithm.kl_penalty": "kl",
}
GROUP_NORMALISED = ("grpo", "grpo_passk", "grpo_vectorized")


@dataclass
class Card:
    lines: list[str]

    def add(self, text: str) -> None:
        self.lines.append(text)

    def warn(self, text: str) -> None:
        self.lines.append(f"! {text}")

    def __str__(self) -> str:
        return "\n".join(self.lines)


def _get(cfg, dotted: str):
    value = cfg
    for part in dotted.split("."):
        value = getattr(value, part)
    return value


def objective_card(cfg: RLVRConfig) -> str:
    arr, algo, data = cfg.actor_rollout_ref, cfg.algorithm, cfg.data
    actor, rollout = arr.actor, arr.rollout
    card = Card([])
    prompts, n = data.train_batch_size, rollout.n
    minis = max(1, -(-prompts // actor.ppo_mini_batch_size))  # the last may be smaller
    updates = actor.ppo_epochs * minis
    micro = (f"micro-batches of up to {actor.ppo_max_token_len_per_gpu} tokens per device (use_dynamic_bsz)"
             if actor.use_dynamic_bsz else f"micro-batches of {actor.ppo_micro_batch_size_per_gpu} rows per device")
    card.add(f"batch: {prompts} prompts x n={n} = {prompts * n} rows a step; {minis} mini-batch(es) of "
             f"{actor.ppo_mini_batch_size} prompts x {actor.ppo_epochs} epoch(s) = {updates} optimizer step(s) per "
             f"rollout; {micro}")
    if algo.filter_groups.enable:
        card.add(f"dynamic sampling (DAPO): groups whose {algo.filter_groups.metric} does not vary are dropped and "
                 "more prompts drawn until the batch is full")
    # advantages
    if algo.adv_estimator in GROUP_NORMALISED:
        norm = "(r - group mean) / group std" if algo.norm_adv_by_std_in_grpo else "r - group mean (Dr.GRPO)"
        card.add(f"advantage: {algo.adv_estimator}, {norm}, over each prompt's {n} samples")
    else:
        card.add(f"advantage: {algo.adv_estimator}")
    card.add(policy_loss_line(actor))
    # KL
    if actor.use_kl_loss and algo.use_kl_in_reward:
        card.add(f"KL: in the loss ({actor.kl_loss_type}, coef {actor.kl_loss_coef}) and in the reward "
                 f"({algo.kl_penalty}, {algo.kl_ctrl.type} coef {algo.kl_ctrl.kl_coef})")
        card.warn("the KL to the reference is applied twice: in the loss and in the reward")
    elif actor.use_kl_loss:
        card.add(f"KL: in the loss, {actor.kl_loss_type} to the frozen reference, coef {actor.kl_loss_coef}")
    elif algo.use_kl_in_reward:
        card.add(f"KL: subtracted from the reward, {algo.kl_penalty}, {algo.kl_ctrl.type} coef {algo.kl_ctrl.kl_coef}")
    else:
        card.add("KL: none (no reference model)")
    if cfg.distillation.enabled:
        card.add(distillation_line(cfg))
    clip = actor.grad_clip
    card.add(f"gradient clip: each optimizer step scales the gradients by min(1, {clip} / global norm), so no step's "
             f"norm passes {clip} (grad_norm is logged before the clip)" if clip != float("inf")
             else "gradient clip: none (grad_clip=inf)")
    # off-policy degree
    mode, ahead = cfg.trainer.v1.trainer_mode, cfg.trainer.v1.colocate_async.num_warmup_batches
    stale = ahead if mode != "sync" else 0
    degree = ("on-policy updates: 1 optimizer step per rollout" if updates == 1 else
              f"off-policy updates: {updates} optimizer steps per rollout, the first on-policy, the last "
              f"{updates - 1} update(s) past pi_old")
    card.add(degree + (f"; samples generated {stale} update(s) before the step that trains them ({mode})"
                       if stale else ""))
    if updates > 1 and stale:
        card.warn(f"off-policy sources stack: {updates} updates per rollout on samples already {stale} update(s) "
                  "stale; the clip is taken around pi_old recomputed now")
    # importance sampling
    rc = algo.rollout_correction
    if rc.bypass_mode:
        card.add(f"importance sampling: bypass mode, pi_old = the rollout's log-probs ({rc.loss_type})"
                 + (f", weights {rc.rollout_is}" if rc.rollout_is else "")
                 + (f", rejection {rc.rollout_rs} at {rc.rollout_rs_threshold}" if rc.rollout_rs else ""))
    elif rc.rollout_is or rc.rollout_rs:
        card.add("importance sampling: pi_old / pi_rollout"
                 + (f", {rc.rollout_is} weights at {rc.rollout_is_threshold}" if rc.rollout_is else "")
                 + (f", rejection {rc.rollout_rs} at {rc.rollout_rs_threshold}" if rc.rollout_rs else ""))
    else:
        card.add("importance sampling: none (pi_old recomputed by the actor; the gap to the sampler is measured: "
                 "training/rollout_probs_diff_*)")
        if stale:
            card.warn(f"samples {stale} update(s) stale and no rollout correction: the gap to the sampler is "
                      "measured but not corrected (algorithm.rollout_correction.rollout_is)")
    truncated = [f"{k}={v}" for k, v, off in (("top_p", rollout.top_p, 1.0), ("top_k", rollout.top_k, -1),
                                                ("min_p", rollout.min_p, 0.0)) if v != off and not (k == "top_k" and v == 0)]
    if truncated:
        card.warn(f"truncated sampling ({', '.join(truncated)}): the rollout's log-probs are of the kept support, the "
                  "actor's of the whole vocabulary; without rollout correction the update ignores the truncation")
    # inert keys
    for key, why in _inert(cfg):
        card.warn(f"{key} is set but has no effect: {why}")
    # defaults that differ from verl's
    differ = [f"{key}={_get(cfg, key)!r} (verl {value!r})" for key, value in VERL_DEFAULTS.items()
              if _get(cfg, key) != value]
    if differ:
        card.add("differs from verl's defaults: " + "; ".join(differ))
    return str(card)


def policy_loss_line(actor) -> str:
    """The policy loss, its clip (SAPO: its gate's temperatures; GPG: none) and its aggregation: a loss
    that aggregates its own way (GSPO, SAPO, GMPO, as in verl) is not aggregated by loss_agg_mode."""
    mode = actor.policy_loss.loss_mode
    if mode == "sapo":
        shape = f"soft gate tau_pos {actor.policy_loss.tau_pos}, tau_neg {actor.policy_loss.tau_neg}"
    elif mode == "gpg":
        shape = "no ratio, no clip"
    elif mode == "geo_mean":  # GMPO clips each token's log-ratio
        shape = f"log-ratio clip [{-_low(actor):.2f}, {_high(actor):.2f}] per token"
    else:
        shape = f"clip [{1 - _low(actor):.2f}, {1 + _high(actor):.2f}]" + (
            f", dual clip {actor.clip_ratio_c}" if mode == "vanilla" else "")
    own = OWN_AGGREGATION.get(mode)
    aggregated = (f"aggregated {own} whatever loss_agg_mode says ({actor.loss_agg_mode} aggregates the entropy and "
                  "KL terms)" if own else f"aggregated {actor.loss_agg_mode}")
    return (f"policy loss: {mode}, {shape}; {aggregated}"
            + (f"; entropy bonus {actor.entropy_coeff}" if actor.entropy_coeff else ""))


def distillation_line(cfg: RLVRConfig) -> str:
    """On-policy distillation: the teacher(s), the per-token loss and how it joins the objective."""
    d = cfg.distillation
    loss, entries = d.distillation_loss, teacher_entries(d)
    teachers = ", ".join(f"{key}: {e.model_path}" + (f" (served at {', '.join(e.inference.external_server_addresses)})"
                                                      if e.inference.external_server_addresses else "")
                         for key, e in entries.items())
    what = (f"{loss.loss_mode} over the teacher's top {loss.topk} tokens" if get_distillation_loss(loss.loss_mode).use_topk
            else f"{loss.loss_mode} of each sampled token's log-probs")
    how = (f"as a per-token advantage (-loss) in a PPO clip [{1 - (loss.clip_ratio_low or loss.clip_ratio):.2f}, "
           f"{1 + (loss.clip_ratio_high or loss.clip_ratio):.2f}]" if loss.use_policy_gradient
           else f"aggregated {cfg.actor_rollout_ref.actor.loss_agg_mode}")
    joins = (f"added to the policy loss x {loss.distillation_loss_coef}" if loss.use_task_rewards
             else "the whole loss: the policy loss above is not trained (use_task_rewards=false)")
    return (f"distillation: {what}, {how}"
            + (f", each clamped to +-{loss.loss_max_clamp}" if loss.loss_max_clamp is not None else "")
            + f"; {joins}; teacher{'s by ' + d.teacher_key if len(entries) > 1 else ''} {teachers}")


def _low(actor) -> float:
    return actor.clip_ratio_low if actor.clip_ratio_low is not None else actor.clip_ratio


def _high(actor) -> float:
    return actor.clip_ratio_high if actor.clip_ratio_high is not None else actor.clip_ratio


def _inert(cfg: RLVRConfig) -> list[tuple[str, str]]:
    """(key, why) for settings away from their default that the active path never reads."""
    arr, algo = cfg.actor_rollout_ref, cfg.algorithm
    actor = arr.actor
    out = []
    if not actor.use_kl_loss and actor.kl_loss_coef != 0.001:
        out.append(("actor_rollout_ref.actor.kl_loss_coef", "actor.use_kl_loss is false"))
    if not algo.use_kl_in_reward and algo.kl_ctrl.kl_coef != 0.001:
        out.append(("algorithm.kl_ctrl.kl_coef", "algorithm.use_kl_in_reward is false"))
    if algo.adv_estimator not in GROUP_NORMALISED and not algo.norm_adv_by_std_in_grpo:
        out.append(("algorithm.norm_adv_by_std_in_grpo", f"the {algo.adv_estimator} estimator does not read it"))
    if actor.policy_loss.loss_mode != "vanilla" and actor.clip_ratio_c != 3.0:
        out.append(("actor_rollout_ref.actor.clip_ratio_c", f"dual clip belongs to the vanilla loss, not "
                                                            f"{actor.policy_loss.loss_mode}"))
    if not cfg.data.val_files and (cfg.trainer.test_freq > 0 or cfg.trainer.val_before_train):
        out.append(("trainer.test_freq / trainer.val_before_train", "data.val_files is empty (no validation runs)"))
    if algo.adv_estimator != "gae" and (algo.gamma != 1.0 or algo.lam != 1.0):
        out.append(("algorithm.gamma / algorithm.lam", f"they discount GAE; {algo.adv_estimator} does not read them"))
    return out
