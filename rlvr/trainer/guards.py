"""Checks every training run makes, each stopping the run with what it found rather than training
on silently (the public bugs each answers: docs/silent.md): groups whole before their
advantages, masks nested, the freshness probe's tolerance, and the engine against the actor.

The engine against the actor (``EngineParity``): the rollout engine reports the log-prob of
every token it samples, and the actor recomputes them (``old_log_probs``). At step 1 no update
has happened, so the two must agree within the precision's noise: a larger gap is a training
forward that is not the model's own (a family's logit transform or attention rlvr misses), and
the run stops naming the family, the layout and the gap (the parity guard). From then on the
same mean gap, on the samples the actor's current weights generated, may not grow past
``DRIFT_FACTOR`` times what step 1 measured (nor past a floor per precision): an engine left
with some stale weights (one layer's sync lost) drifts away from the actor long before its
greedy tokens change. verl only logs the gap (``training/rollout_probs_diff_*``)."""

from __future__ import annotations

import math
from collections import Counter

import numpy as np
import torch

from rlvr.algos.utils import uid_list
from rlvr.config.schema import RLVRConfig
from rlvr.errors import StopTraining
from rlvr.protocol import DataProto, loss_mask
from rlvr.models.loader import model_folder, read_config_json

PROBE_TOKENS = 16  # the freshness probe: greedy tokens per prompt compared with the actor's
GAP_TEMPERATURE = 1e-4  # -T log softmax(z / T)[token] is max(z) - z[token], to within T ln V (0.0011 at V = 50k)


FRESHNESS_FLOOR = {"float32": 0.01, "16-bit": 0.25}  # logits: the probe's tolerance at small logits
BF16_STEPS = 2  # bf16 rounding steps a 16-bit near-tie may open: each side rounds each logit by up to half a step


def bf16_step(magnitude: float) -> float:
    """The spacing of bfloat16 numbers at ``magnitude``: 2^(e - 7) for |x| in [2^e, 2^(e+1)) (0.25 in
    [32, 64), 0.5 in [64, 128), 1 in [128, 256)). bf16 is the only 16-bit dtype rlvr computes in."""
    exponent = math.frexp(abs(magnitude))[1] - 1  # |x| = m 2^(e+1), m in [0.5, 1): floor(log2 |x|) = e
    return math.ldexp(torch.finfo(torch.bfloat16).eps, exponent)


def freshness_tolerance(config: RLVRConfig, max_abs_logit: float) -> float:
    """How far (in logits) the engine's greedy token may trail the actor's own greedy token and
    still be two precisions disagreeing on a near-tie rather than stale weights: 0.01 when actor
    and engine both compute in fp32; with a 16-bit side, ``BF16_STEPS`` bf16 steps at the largest
    |logit| the probe saw (``max_abs_logit``), at least 0.25. The step grows with the logits (0.25
    in [32, 64), 0.5 in [64, 128)): a fixed 0.25 stopped a fresh engine whose logits reach 64."""
    precision = _precision(config)
    if precision == "float32":
        return FRESHNESS_FLOOR[precision]
    return max(FRESHNESS_FLOOR[precision], BF16_STEPS * bf16_step(max_abs_logit))


# mean and max |log p_engine - log p_actor| over the sampled tokens at step 1, fresh weights (nats).
# Measured with bench/parity_noise.py (docs/training.md, "The engine against the actor"):
# fp32 engine sharing the actor's weights: 1.2e-7 mean / 1.9e-6 max (tiny model; vLLM's fp32 CPU
# kernels: max 2e-3, tests/rollout/test_vllm.py); bf16 engine copy: 6.6e-4 / 3.3e-3 (tiny model),
# the rest in docs/training.md's table (SmolLM2-135M; a random 1024-wide Llama with its logits
# moved into [32, 64), where one bf16 rounding step is 0.25).
# A 16-bit side's gap grows with the bf16 step at the logits' size: every logit + 48 / 100 / 200 (steps 0.25,
# 0.5, 1.0) gave mean 0.069 / 0.126 / 0.24 and max 0.31 / - / 0.89, about 0.25 steps mean and 1.2 steps max.
PARITY_TOLERANCE = {"float32": (1e-3, 2e-2), "16-bit": (0.15, 2.0)}
PARITY_BF16_STEPS = (0.6, 8.0)  # (mean, max) with a 16-bit side, in bf16 steps at the largest |logit|: floors above
DRIFT_FACTOR = 10.0  # a healthy bf16 run's mean gap grew at most 6.8x over step 1's (tiny model, lr 0.05)
DRIFT_FLOOR = {"float32": 2e-3, "16-bit": 0.02}  # below this mean gap a drift is never called staleness


def _precision(config: RLVRConfig) -> str:
    """float32 when actor and engine both compute in fp32, else 16-bit."""
    arr = config.actor_rollout_ref
    dtypes = (arr.actor.dtype, arr.rollout.dtype, arr.actor.fsdp_config.mixed_precision.param_dtype)
    return "float32" if all(d in ("float32", "auto") for d in dtypes) else "16-bit"


def parity_tolerance(config: RLVRConfig, max_abs_logit: float = 0.0) -> tuple[float, float]:
    """(mean, max) |log p_engine - log p_actor| allowed at step 1: the precision's floor; with a 16-bit
    side, at least ``PARITY_BF16_STEPS`` bf16 steps at the largest |logit| seen (0.6 and 8 nats in [128,
    256)), since rounding each logit by half a step moves a log-prob by up to a step."""
    precision = _precision(config)
    floor_mean, floor_max = PARITY_TOLERANCE[precision]
    if precision == "float32":
        return floor_mean, floor_max
    step = bf16_step(max_abs_logit)
    return max(floor_mean, PARITY_BF16_STEPS[0] * step), max(floor_max, PARITY_BF16_STEPS[1] * step)


def drift_threshold(config: RLVRConfig, baseline: float | None) -> float:
    """The mean gap past which the engine is stale: ``DRIFT_FACTOR`` times step 1's, at least the floor."""
    floor = DRIFT_FLOOR[_precision(config)]
    return floor if baseline is None else max(DRIFT_FACTOR * baseline, floor)


def log_prob_gap(rollout_log_probs: torch.Tensor, actor_log_probs: torch.Tensor,
                 mask: torch.Tensor) -> tuple[float, float, tuple[int, int]]:
    """(mean, max, (row, column) of the max) of |log p_engine - log p_actor| over ``mask``'s tokens."""
    gap = torch.where(mask.bool(), (rollout_log_probs.float() - actor_log_probs.float()).abs(), torch.zeros(()))
    count = int(mask.bool().sum())
    if count == 0:
        return 0.0, 0.0, (0, 0)
    row, col = divmod(int(gap.argmax()), gap.shape[1])
    return float(gap.sum()) / count, float(gap.max()), (row, col)


def model_family(config: RLVRConfig) -> str:
    """``model_type`` and ``architectures`` of the policy's config.json, for a message."""
    path = config.actor_rollout_ref.model.path
    try:
        cfg = read_config_json(model_folder(path))
    except (OSError, ValueError) as err:  # a message about the gap must not fail on the folder
        return f"{path} (config.json unreadable: {err})"
    return f"model_type {cfg.get('model_type')!r}, architectures {cfg.get('architectures')}"


def forward_layout(config: RLVRConfig) -> str:
    """The training forward's layout (``rlvr/workers/forward.py``)."""
    if config.actor_rollout_ref.actor.share_prompt_forward and config.actor_rollout_ref.rollout.n > 1:
        return ("the grouped prompt-once layout (actor.share_prompt_forward=true: flat with SDPA attention, "
                "padded otherwise)")
    if config.actor_rollout_ref.rollout.n == 1:  # no prompt to share: groups of one, packed flat
        return "the flat layout of one row a prompt (with SDPA attention; padded rows otherwise)"
    return "the per-row layout"


class EngineParity:
    """The engine's log-probs of its own sampled tokens against the actor's: the parity guard at
    step 1, the drift check after (see the module docstring). Holds the first mean gap of each
    measurement (the training batch's, the freshness probe's): the precision's noise on this model."""

    def __init__(self, config: RLVRConfig):
        self.config = config
        self.baselines: dict[str, float] = {}  # prefix -> its first mean gap (step 1; a resumed run: its first)
        self.max_abs_logit = 0.0  # the largest |logit| the freshness probe saw (it runs first at step 1)

    def check(self, rollout_log_probs: torch.Tensor, actor_log_probs: torch.Tensor, mask: torch.Tensor, step: int,
              what: str = "sampled", prefix: str = "training/engine_parity",
              max_abs_logit: float | None = None) -> dict[str, float]:
        """Stop the run on a gap past the parity tolerance (at step 1) or past the drift threshold of
        the first gap measured under ``prefix``; returns ``<prefix>/log_prob_gap_{mean,max}``. Each
        measurement has its own reference: greedy tokens and sampled ones do not carry the same noise.
        ``max_abs_logit`` (the probe's) is kept for every later check's 16-bit tolerance."""
        if max_abs_logit is not None:
            self.max_abs_logit = max(self.max_abs_logit, max_abs_logit)
        if not bool(mask.bool().any()):
            return {}
        mean, worst, (row, col) = log_prob_gap(rollout_log_probs, actor_log_probs, mask)
        metrics = {f"{prefix}/log_prob_gap_mean": mean, f"{prefix}/log_prob_gap_max": worst}
        where = (f"mean |log p_engine - log p_actor| {mean:.3g} nats over the {int(mask.bool().sum())} {what} tokens, "
                 f"max {worst:.3g} (row {row + 1}, response token {col + 1})")
        tol_mean, tol_max = parity_tolerance(self.config, self.max_abs_logit)
        precision = _precision(self.config)
        if precision != "float32":
            precision += f", largest |logit| {self.max_abs_logit:.3g}"
        if step == 1 and (mean > tol_mean or worst > tol_max):
            raise StopTraining(
                f"step 1: before any update the actor's log-probs of the engine's own samples differ from the "
                f"engine's: {where}; tolerance mean {tol_mean:.3g}, max {tol_max:.3g} ({precision}). The "
                f"training forward does not compute what the model computes for {model_family(self.config)} in "
                f"{forward_layout(self.config)}: a logit transform or attention mask of this family is missed, so "
                "every update would train a distribution the sampler never had. Try "
                "actor_rollout_ref.actor.share_prompt_forward=false; report the family "
                "(trainer.freshness_check_freq=-1 turns this check off)")
        if prefix not in self.baselines:
            self.baselines[prefix] = mean
            return metrics
        threshold = drift_threshold(self.config, self.baselines[prefix])
        metrics[f"{prefix}/drift_threshold"] = threshold
        if mean > threshold:
            raise StopTraining(
                f"step {step}: the rollout engine's log-probs have drifted from the actor's: {where}, over "
                f"{threshold:.3g} ({DRIFT_FACTOR:g}x the first check's {self.baselines[prefix]:.3g}, at least "
                f"{DRIFT_FLOOR[_precision(self.config)]} for {_precision(self.config)}). The engine holds weights "
                "the actor no longer has, wholly or in part (a weight sync that missed some tensors): the run stops "
                "before training on them (trainer.freshness_check_freq=-1 turns this check off)")
        return metrics


def check_groups(uids: np.ndarray, n: int, step: int, episodes: np.ndarray | None = None) -> None:
    """Every group reaches the advantage estimator whole: ``n`` rows per prompt (AReaL #1419: a
    group that lost rows to a filter or a collection across ranks is normalised over the wrong
    mean and std, silently). Rows left out of the update stay in the batch (``train_mask``), so
    a group short of rows, or with more, is a bug upstream: stopped here, named. With
    ``episodes`` (each row's episode, where an episode may be several samples) a group is ``n``
    episodes."""
    if episodes is not None:  # one entry per episode
        first = np.append(True, episodes[1:] != episodes[:-1])
        uids = np.asarray(uids)[first]
    counts = Counter(uid_list(uids))  # by value, as the estimators group (1 and "1" are two groups)
    wrong = [(g, c) for g, c in counts.items() if c != n]
    if wrong:
        named = ", ".join(f"{g!r}: {c} {'episodes' if episodes is not None else 'rows'}" for g, c in wrong[:3])
        raise StopTraining(f"step {step}: {len(wrong)} of {len(counts)} groups do not have "
                           f"actor_rollout_ref.rollout.n = {n} rows before their advantages ({named}); a group "
                           "normalised over fewer or more samples than it has gets a wrong baseline")


def check_masks(batch: DataProto, step: int) -> None:
    """Loss only where a token was sampled, and a token only where it is present: the loss mask
    (``train_mask``, else ``response_mask``) within ``response_mask`` (tool output and padding are
    0 there), within the attention mask's response part (truncation included). A token outside
    would train on padding or on text the model did not write, silently."""
    response, loss = batch.batch["response_mask"].bool(), loss_mask(batch).bool()
    present = batch.batch["attention_mask"][:, -response.shape[1]:].bool()
    for inner, outer, what in ((loss, response, "the loss mask is outside response_mask"),
                               (response, present, "response_mask marks tokens the attention mask does not hold")):
        outside = inner & ~outer
        if outside.any():
            row, col = (int(i) for i in outside.nonzero()[0])
            raise StopTraining(f"step {step}: {what} at {int(outside.sum())} token(s), first at row {row}, response "
                               f"token {col}; the update would train on tokens the model did not sample")
