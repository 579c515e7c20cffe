"""The mathematical core: advantage estimators, policy losses, KL, loss aggregation.

Pure tensor functions; estimators and losses sit behind registries so the trainer never
special-cases one (``get_adv_estimator_fn(name)``, ``get_policy_loss_fn(name)``).
"""

from rlvr.algos.advantages import (
    ADV_ESTIMATORS,
    compute_advantage,
    get_adv_estimator_fn,
    register_adv_est,
)
from rlvr.algos.dapo import filter_groups, overlong_penalty
from rlvr.algos.kl import (
    AdaptiveKLController,
    FixedKLController,
    apply_kl_penalty,
    get_kl_controller,
    kl_penalty,
)
from rlvr.algos.losses import (
    POLICY_LOSSES,
    agg_loss,
    get_policy_loss_fn,
    register_policy_loss,
)
from rlvr.algos.rollout_correction import reinforce_loss, rollout_correction
from rlvr.algos.utils import compute_response_mask, masked_mean, masked_sum, masked_var, masked_whiten

__all__ = [
    "ADV_ESTIMATORS", "POLICY_LOSSES", "AdaptiveKLController", "FixedKLController", "agg_loss",
    "apply_kl_penalty", "compute_advantage", "compute_response_mask",
    "filter_groups", "get_adv_estimator_fn", "get_kl_controller", "get_policy_loss_fn", "kl_penalty",
    "masked_mean", "masked_sum", "masked_var", "masked_whiten", "overlong_penalty", "register_adv_est", "register_policy_loss",
    "reinforce_loss", "rollout_correction",
]
