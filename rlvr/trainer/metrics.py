"""Step and validation metrics, named as verl names them.

- ``critic/score/*`` (the reward function's sequence score), ``critic/rewards/*`` (after
  the KL penalty), ``critic/advantages/*``, ``critic/returns/*`` (``critic/values/*`` with
  a critic): mean, max and min over valid tokens or sequences;
- ``response_length/*`` and ``prompt_length/*`` with ``clip_ratio`` (share at the limit);
- ``timing_s/<stage>``, ``timing_per_token_ms/<stage>``, ``perf/*``;
- ``training/rollout_probs_diff_{mean,max}``: |p_rollout - p_actor| per token, a check that
  the engine samples from the distribution the actor trains;
- validation: ``val-core/<data_source>/reward/{mean,best,maj}@k``.
"""

from __future__ import annotations

import contextlib
import time
from collections import Counter, defaultdict
from typing import Iterator

import numpy as np
import torch

from rlvr.protocol import DataProto


@contextlib.contextmanager
def timer(name: str, timings: dict[str, float]) -> Iterator[None]:
    """Add the block's wall time to ``timings[name]``."""
    start = time.perf_counter()
    try:
        yield
    finally:
        timings[name] = timings.get(name, 0.0) + time.perf_counter() - start


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
    response_length = b["attention_mask"][:, -R:].sum(-1).float()
    prompt_length = prompt_mask.sum(-1).float()
    metrics = {}
    metrics.update(_stats("critic/score", b["token_level_scores"].sum(-1)))
    metrics.update(_stats("critic/rewards", b["token_level_rewards"].sum(-1)))
    metrics.update(_stats("critic/advantages", b["advantages"][mask]))
    metrics.update(_stats("critic/returns", b["returns"][mask]))
    if "values" in b:
        metrics.update(_stats("critic/values", b["values"][mask]))
    metrics.update(_stats("response_length", response_length))
    metrics["response_length/clip_ratio"] = float((response_length >= max_response_length).float().mean())
    metrics.update(_stats("prompt_length", prompt_length))
    # batches are padded to their own longest prompt, so the limit comes from the config
    metrics["prompt_length/clip_ratio"] = float((prompt_length >= max_prompt_length).float().mean())
    if "rollout_log_probs" in b and "old_log_probs" in b:
        diff = (b["rollout_log_probs"].exp() - b["old_log_probs"].exp()).abs()[mask]
        if diff.numel():
            metrics["training/rollout_probs_diff_mean"] = float(diff.mean())
            metrics["training/rollout_probs_diff_max"] = float(diff.max())
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


def validation_metrics(data_sources, groups, scores, answers) -> dict[str, float]:
    """``val-core/<data_source>/reward/{mean,best,maj}@k`` from per-sample scores.

    ``groups`` names each sample's prompt (k samples share one); ``answers`` is what the
    majority vote counts (the extracted answer when the scorer reports one, else the text).
    mean@k averages every sample; best@k averages each prompt's best score; maj@k averages
    the score of each prompt's most frequent answer. For k = 1 all three are the accuracy,
    so only mean@1 is reported.
    """
    by_source: dict[str, dict] = defaultdict(lambda: defaultdict(list))
    for source, group, score, answer in zip(data_sources, groups, scores, answers):
        by_source[source][group].append((float(score), answer))
    metrics = {}
    for source, prompts in sorted(by_source.items()):
        k = max(len(samples) for samples in prompts.values())
        all_scores = [s for samples in prompts.values() for s, _ in samples]
        metrics[f"val-core/{source}/reward/mean@{k}"] = float(np.mean(all_scores))
        if k > 1:
            metrics[f"val-core/{source}/reward/best@{k}"] = float(np.mean([max(s for s, _ in v) for v in prompts.values()]))
            metrics[f"val-core/{source}/reward/maj@{k}"] = float(np.mean([_majority_score(v) for v in prompts.values()]))
    return metrics


def _majority_score(samples: list[tuple[float, object]]) -> float:
    """Score of the most frequent answer (ties: the answer seen first)."""
    counts = Counter(str(a) for _, a in samples)
    top = max(counts.values())
    for score, answer in samples:
        if counts[str(answer)] == top:
            return score
    return 0.0
