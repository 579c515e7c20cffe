"""Step and validation metrics, named as verl names them.

- ``critic/score/*`` (the reward function's sequence score), ``critic/rewards/*`` (after
  the KL penalty), ``critic/advantages/*``, ``critic/returns/*`` (``critic/values/*`` with
  a critic): mean, max and min over valid tokens or sequences;
- ``response_length/*`` and ``prompt_length/*`` with ``clip_ratio`` (share at the limit);
- ``timing_s/<stage>``, ``timing_per_token_ms/<stage>``, ``perf/*``;
- ``training/zero_variance_groups``: groups whose samples all scored the same (no GRPO signal);
  ``training/dropped_groups``: groups left out of the update for a reward that is not a number;
- ``training/rollout_probs_diff_{mean,max}``: |p_rollout - p_actor| per token (verl's), and
  ``training/rollout_log_probs_diff_{mean,max}``: |log p_rollout - log p_actor|, the engine against
  the actor. The first is scaled by the token's probability: a random tiny model's tokens have
  p ~ 2e-5, so even a stale engine read 1e-8 to 4e-4 there, 0.0 to a few decimals; the second
  reads the same gap whatever p is. Neither is reported when pi_old is the rollout's own
  log-probs (rollout correction's bypass mode), where it would compare the engine with itself;
- validation: ``val-core/<data_source>/reward/mean@n`` and verl's bootstrapped
  ``best@k``/``worst@k``/``maj@k`` (see ``validation_metrics``).
"""

from __future__ import annotations

import contextlib
import time
from collections import defaultdict
from typing import Iterator

import numpy as np
import torch

from rlvr.algos.utils import group_ids, group_range
from rlvr.protocol import DataProto


@contextlib.contextmanager
def timer(name: str, timings: dict[str, float]) -> Iterator[None]:
    """Add the block's wall time to ``timings[name]``."""
    start = time.perf_counter()
    try:
        yield
    finally:
        timings[name] = timings.get(name, 0.0) + time.perf_counter() - start


def reduce_metrics(metrics: dict) -> dict[str, float]:
    """Worker metrics as one float each: a list (gathered from several workers by
    ``DataProto.concat``) becomes its mean, as verl's ``reduce_metrics`` does."""
    return {k: float(np.mean(v)) if isinstance(v, (list, tuple)) else float(v) for k, v in metrics.items()}


def _stats(prefix: str, values: torch.Tensor) -> dict[str, float]:
    values = values.float()
    if values.numel() == 0:
        return {}
    return {f"{prefix}/mean": float(values.mean()), f"{prefix}/max": float(values.max()),
            f"{prefix}/min": float(values.min())}


def compute_data_metrics(batch: DataProto, max_response_length: int, max_prompt_length: int) -> dict[str, float]:
    """Scores, rewards, advantages, returns, values and lengths of one training batch."""
    b = batch.batch
    mask = b["response_mask"].bool()
    R = b["responses"].shape[1]
    prompt_mask = b["attention_mask"][:, :-R]
    response_length = b["response_mask"].sum(-1).float()  # the model's tokens (tool output excluded)
    budget_used = b["attention_mask"][:, -R:].sum(-1).float()  # what max_response_length bounds
    prompt_length = prompt_mask.sum(-1).float()
    metrics = dict(batch.meta_info.get("rollout_metrics", {}))  # the engine's own counters (rollout servers)
    metrics.update(_stats("critic/score", b["token_level_scores"].sum(-1)))
    metrics.update(_stats("critic/rewards", b["token_level_rewards"].sum(-1)))
    metrics.update(_stats("critic/advantages", b["advantages"][mask]))
    metrics.update(_stats("critic/returns", b["returns"][mask]))
    if "values" in b:
        metrics.update(_stats("critic/values", b["values"][mask]))
    metrics.update(_stats("response_length", response_length))
    metrics["response_length/clip_ratio"] = float((budget_used >= max_response_length).float().mean())
    metrics.update(_stats("prompt_length", prompt_length))
    # batches are padded to their own longest prompt, so the limit comes from the config
    metrics["prompt_length/clip_ratio"] = float((prompt_length >= max_prompt_length).float().mean())
    metrics.update(multi_turn_metrics(batch))
    if "uid" in batch.non_tensor_batch:  # groups whose samples all scored the same: no signal for GRPO
        ids, num_groups = group_ids(batch.non_tensor_batch["uid"])
        lo, hi = group_range(b["token_level_scores"].sum(-1).double(), ids, num_groups)
        metrics["training/zero_variance_groups"] = float((lo == hi).sum())
    metrics.update(rollout_diff_metrics(batch))
    return metrics


def rollout_diff_metrics(batch: DataProto) -> dict[str, float]:
    """The engine's log-probs of its sampled tokens against the actor's (``old_log_probs``), in
    probabilities (verl's) and in log-probs; none when pi_old was taken from the rollout itself."""
    b = batch.batch
    mask = b["response_mask"].bool()
    if "rollout_log_probs" not in b or "old_log_probs" not in b or not mask.any():
        return {}
    if batch.meta_info.get("old_log_probs_source") == "rollout":  # bypass mode: one tensor against its copy
        return {}
    diff = (b["rollout_log_probs"].exp() - b["old_log_probs"].exp()).abs()[mask]
    log_diff = (b["rollout_log_probs"] - b["old_log_probs"]).abs()[mask]
    return {"training/rollout_probs_diff_mean": float(diff.mean()), "training/rollout_probs_diff_max": float(diff.max()),
            "training/rollout_log_probs_diff_mean": float(log_diff.mean()),
            "training/rollout_log_probs_diff_max": float(log_diff.max())}


def multi_turn_metrics(batch: DataProto, prefix: str = "") -> dict[str, float]:
    """The multi-turn statistics of a rollout batch (none for a single-turn one); see ``multi_turn_stats``."""
    nt = batch.non_tensor_batch
    if "num_turns" not in nt:
        return {}
    return multi_turn_stats(list(nt["num_turns"]), list(nt["multi_turn_metrics"]), tool_tokens(batch), prefix)


def tool_tokens(batch: DataProto) -> list[int]:
    """Per sample: the response's tokens that are not the model's (tool output, template)."""
    R = batch.batch["responses"].shape[1]
    return (batch.batch["attention_mask"][:, -R:] - batch.batch["response_mask"]).sum(-1).tolist()


def multi_turn_stats(num_turns: list, counters: list[dict], tool_tokens: list, prefix: str = "") -> dict[str, float]:
    """``num_turns/{mean,max,min}`` and the per-sample tool counters of a multi-turn rollout:
    ``multi_turn/<counter>`` is the mean per sample (``tool_calls``, ``tool_calls/<tool>``,
    ``tool_errors``, ``tool_timeouts``, ``invalid_json``, ``invalid_arguments``, ``unknown_tool``,
    ``dropped_calls``, ``truncated``, ``tokenization_mismatch``, ``failed``), plus
    ``multi_turn/tool_call_rate`` (samples with a call), ``multi_turn/tool_latency_s``
    (mean per call a tool ran) and ``multi_turn/tool_tokens/mean`` (tool and template tokens per sample)."""
    turns = np.asarray(num_turns, dtype=float)
    metrics = {f"{prefix}num_turns/mean": float(turns.mean()), f"{prefix}num_turns/max": float(turns.max()),
               f"{prefix}num_turns/min": float(turns.min())}
    runs = sum(c.get("tool_runs", 0) for c in counters)  # calls a tool ran (not the malformed ones)
    for key in sorted(set().union(*counters)):
        if key == "tool_runs":
            continue
        if key == "tool_latency_s":
            metrics[f"{prefix}multi_turn/tool_latency_s"] = sum(c.get(key, 0.0) for c in counters) / max(runs, 1)
        else:
            metrics[f"{prefix}multi_turn/{key}"] = float(np.mean([c.get(key, 0) for c in counters]))
    metrics[f"{prefix}multi_turn/tool_call_rate"] = float(np.mean([c.get("tool_calls", 0) > 0 for c in counters]))
    metrics[f"{prefix}multi_turn/tool_tokens/mean"] = float(np.mean(tool_tokens))
    return metrics


def compute_timing_metrics(batch: DataProto, timings: dict[str, float]) -> dict[str, float]:
    """``timing_s/<stage>`` and, per generated or processed token, ``timing_per_token_ms/<stage>``."""
    R = batch.batch["responses"].shape[1]
    response_tokens = float(batch.batch["attention_mask"][:, -R:].sum())
    all_tokens = float(batch.batch["attention_mask"].sum())
    metrics = {f"timing_s/{name}": t for name, t in timings.items()}
    for name, t in timings.items():
        tokens = response_tokens if name == "gen" else all_tokens
        if name not in ("step", "testing", "save_checkpoint") and tokens:
            metrics[f"timing_per_token_ms/{name}"] = 1000.0 * t / tokens
    return metrics


def compute_throughput_metrics(batch: DataProto, step_time: float, n_devices: int = 1) -> dict[str, float]:
    total = float(batch.batch["attention_mask"].sum())
    return {"perf/total_num_tokens": total, "perf/time_per_step": step_time,
            "perf/throughput": total / max(step_time, 1e-9) / n_devices}


def compute_off_policy_metrics(batch: DataProto, step: int, timings: dict[str, float]) -> dict[str, float]:
    """How far behind the trained samples are (verl's ``training/off_policy`` names): a sample's
    staleness is the updates between the weights that generated it (``policy_version``, stamped
    by the engine) and those it trains (step - 1); its span counts the steps from its dispatch
    to its training, both included. Async runs also say who waited: the trainer for the
    engine (``wait_gen``), and the engine for work (the step's time it did not generate)."""
    metrics: dict[str, float] = {}
    non_tensor = batch.non_tensor_batch
    if "policy_version" in non_tensor:
        staleness = (step - 1) - np.asarray(non_tensor["policy_version"], dtype=np.int64)
        metrics.update({"training/off_policy/trajectory_staleness/mean": float(staleness.mean()),
                        "training/off_policy/trajectory_staleness/max": float(staleness.max())})
    if "dispatch_step" in non_tensor:
        spans = step - np.asarray(non_tensor["dispatch_step"], dtype=np.int64) + 1
        metrics.update({"training/off_policy/trajectory_spans/mean": float(spans.mean()),
                        "training/off_policy/trajectory_spans/max": float(spans.max())})
    if "wait_gen" in timings:
        step_s = max(timings["step"], 1e-9)
        busy = timings.get("gen", 0.0) + timings.get("update_weights", 0.0)
        metrics.update({"perf/trainer_idle_ratio": timings["wait_gen"] / step_s,
                        "perf/rollout_idle_ratio": max(0.0, 1.0 - busy / step_s)})
    return metrics


def validation_metrics(data_sources, groups, scores, answers, n_bootstrap: int = 1000,
                       seed: int = 42) -> dict[str, float]:
    """verl's validation metrics from per-sample scores, averaged over prompts.

    ``groups`` names each sample's prompt (n samples share one); ``answers`` is what the
    majority vote counts (the extracted answer when the scorer reports one, else the text).
    Per prompt: ``mean@n``; with n > 1 also ``std@n`` and, for k in 2, 4, 8, ... below n and n
    itself, ``best@k``, ``worst@k`` and ``maj@k`` as ``/mean`` and ``/std`` over ``n_bootstrap``
    draws of k of the n samples with replacement (verl's bootstrap). The ``@n`` mean, best and
    maj metrics are ``val-core/<data_source>/reward/...``; the others ``val-aux/...``.
    """
    by_source: dict[str, dict] = defaultdict(lambda: defaultdict(list))
    for source, group, score, answer in zip(data_sources, groups, scores, answers):
        by_source[source][group].append((float(score), str(answer)))
    metrics = {}
    for source, prompts in sorted(by_source.items()):
        n_max = max(len(samples) for samples in prompts.values())
        per_prompt: dict[str, list[float]] = defaultdict(list)
        for samples in prompts.values():
            for name, value in _prompt_metrics(samples, n_bootstrap, seed).items():
                per_prompt[name].append(value)
        for name, values in per_prompt.items():
            core = name.startswith(("mean", "best", "maj")) and f"@{n_max}" in name and not name.endswith("/std")
            metrics[f"val-{'core' if core else 'aux'}/{source}/reward/{name}"] = float(np.mean(values))
    return metrics


def bootstrap_sizes(n: int) -> list[int]:
    """k = 2, 4, 8, ... below n, then n (verl's subset sizes)."""
    sizes, k = [], 2
    while k < n:
        sizes.append(k)
        k *= 2
    return sizes + [n]


def _prompt_metrics(samples: list[tuple[float, str]], n_bootstrap: int, seed: int) -> dict[str, float]:
    scores = np.array([s for s, _ in samples])  # (n,)
    n = len(scores)
    out = {f"mean@{n}": float(scores.mean())}
    if n == 1:
        return out
    out[f"std@{n}"] = float(scores.std())
    _, codes = np.unique([a for _, a in samples], return_inverse=True)  # answer id per sample
    rng = np.random.default_rng(seed)
    for k in bootstrap_sizes(n):
        idx = rng.integers(0, n, size=(n_bootstrap, k))  # (B, k) draws with replacement
        picked = scores[idx]
        for name, values in (("best", picked.max(axis=1)), ("worst", picked.min(axis=1)),
                             ("maj", _majority_scores(picked, codes[idx]))):
            out[f"{name}@{k}/mean"], out[f"{name}@{k}/std"] = float(values.mean()), float(values.std())
    return out


def _majority_scores(scores: np.ndarray, codes: np.ndarray) -> np.ndarray:
    """Per row of (B, k) draws: the score of the most frequent answer's first occurrence (ties:
    the answer drawn first)."""
    counts = np.zeros((codes.shape[0], codes.max() + 1), dtype=np.int64)  # (B, answers)
    np.add.at(counts, (np.arange(codes.shape[0])[:, None], codes), 1)
    votes = np.take_along_axis(counts, codes, axis=1)  # (B, k) count of each drawn answer
    first_top = (votes == votes.max(axis=1, keepdims=True)).argmax(axis=1)  # (B,)
    return scores[np.arange(len(scores)), first_top]
